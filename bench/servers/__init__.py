"""The small servers the bench starts as processes of their own beside the engines and the scheduler: an
engine that answers at once (`fake_engine`) and a bare gRPC echo (`grpc_echo`), S6's yardsticks."""
