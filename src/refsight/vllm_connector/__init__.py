"""refsight's vLLM encoder-cache connector (:mod:`.refsight_ec_connector`), its store side (:mod:`.refsight_ec_store`)
and the S3 client both it and refsight's bucket store use (:mod:`.refsight_objects`).

This folder is what goes on the vLLM server's ``PYTHONPATH``: the modules import as
top-level names there, with vLLM's own dependencies only (and boto3 for a bucket; refsight is
not installed in vLLM's environment). refsight itself imports :mod:`.refsight_ec_store`
(counters) and :mod:`.refsight_objects` (the bucket store).
"""

from pathlib import Path

#: The folder to put on vLLM's ``PYTHONPATH``.
CONNECTOR_PATH = Path(__file__).resolve().parent
#: The ``--ec-transfer-config`` names of the connector.
CONNECTOR_CLASS = "RefsightECConnector"
CONNECTOR_MODULE = "refsight_ec_connector"
