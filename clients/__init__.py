"""A thin asyncio client for llm-scheduler on top of the generated gRPC stubs."""

from clients.client import SchedulerClient, error_reason, is_retryable, retry_delay
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc

__all__ = ["SchedulerClient", "error_reason", "is_retryable", "pb", "pb_grpc", "retry_delay"]
