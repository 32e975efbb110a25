"""The HTTP edge: what every request passes through before and around its route.

Who calls (:mod:`.auth`, :mod:`.tenants`, :mod:`.gate`, :mod:`.origins`), how much it may send and run
(:mod:`.limits`, :mod:`.json_content`, :mod:`.methods`), when its client leaves (:mod:`.disconnect`), the replies
of errors (:mod:`.http_errors`, in each path's shape: :mod:`.error_shapes`) and the JSON response they share
(:mod:`.responses`), what is measured (:mod:`.metrics`, :mod:`.llama_metrics`) and logged (:mod:`.access_log`),
where the server listens (:mod:`.binding`) and when the model sleeps (:mod:`.sleep`). Nothing here imports the
intake, the replies, the service or the routes.
"""

__all__: list[str] = []
