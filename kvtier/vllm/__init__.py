"""kvtier inside vLLM: the only package that imports vLLM.

``kv_connector_module_path="kvtier.vllm"`` finds ``KVTierConnector`` here.
"""

from kvtier.vllm.access import engine_connector, rank_counters, settle, stats
from kvtier.vllm.connector import KVTierConnector

__all__ = ["KVTierConnector", "engine_connector", "rank_counters", "settle", "stats"]
