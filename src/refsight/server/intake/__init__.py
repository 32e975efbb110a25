"""What every dialect reads from a request, the same way for all: the body models and multipart readers
(:mod:`.bodies`), the generation fields the text routes share (:mod:`.generation_body`, with :mod:`.token_fields`),
a chat's messages and their image parts as engine segments (:mod:`.messages`; every dialect's parts pass through
it), raw prompts and their media (:mod:`.completion_parts`), images by URL (:mod:`.remote_media`, within
:mod:`.fetch_deadline`, decoded by :mod:`.content_encodings`) or by the client's uuid (:mod:`.media_uuids`), and the
prompt's bounds before any model work (:mod:`.prompt_limit`, :mod:`.input_tokens`). Above the edge and the replies;
never the service or a route.
"""

__all__: list[str] = []
