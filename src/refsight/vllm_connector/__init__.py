"""refsight's vLLM encoder-cache connector (:mod:`.refsight_ec_connector`) and its store side (:mod:`.refsight_ec_store`).

This folder is what goes on the vLLM server's ``PYTHONPATH``: both modules import as
top-level names there, with vLLM's own dependencies only (refsight is not installed in
vLLM's environment). refsight itself imports only :mod:`.refsight_ec_store` (counters).
"""

from pathlib import Path

#: The folder to put on vLLM's ``PYTHONPATH``.
CONNECTOR_PATH = Path(__file__).resolve().parent
#: The ``--ec-transfer-config`` names of the connector.
CONNECTOR_CLASS = "RefsightECConnector"
CONNECTOR_MODULE = "refsight_ec_connector"
