"""The embedded engine: llama-cpp-python running a GGUF MoE model, streaming its experts.

``run_engine(EngineConfig(model=..., moe_stream=True, cache_mb=64))`` runs one generation the
way ``bmoe run`` does and returns a :class:`~bmoe.engine.embedded.run.RunResult`;
:func:`~bmoe.engine.embedded.config.parse_args` turns native ``bmoe-cli`` flags into a config;
:func:`~bmoe.engine.embedded.serve.serve_session` serves ``--session`` requests.
"""

from bmoe.engine.embedded.config import EngineConfig, parse_args
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.engine.embedded.serve import serve_session

__all__ = ["EngineConfig", "RunResult", "parse_args", "run_engine", "serve_session"]
