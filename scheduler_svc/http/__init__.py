"""The OpenAI-compatible HTTP front door: a second face beside the gRPC servicer, over the same core."""

from scheduler_svc.http.app import HttpDoor

__all__ = ["HttpDoor"]
