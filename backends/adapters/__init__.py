"""One adapter per engine kind (vLLM, TGI, llama.cpp), each the port's `Backend` over the engine's HTTP API,
built from the shared helpers (`backends.http`, `backends.metrics`); `backends.registry` imports one only
when a configuration names its kind."""

from backends.adapters._adapter import HttpAdapter

__all__ = ["HttpAdapter"]
