"""The gRPC face: the servicer of llmsched.v1, the edge that turns its messages into the core's request
and its events into messages, the one mapping of errors to gRPC statuses, and the decode guard. It may
import dispatch, the core, the generated `llmsched` package and grpc; not the HTTP door or the cluster."""
