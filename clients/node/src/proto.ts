// The API's protos, loaded from the descriptor scripts/gen.js built from the repository's protos/.
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as protobuf from "protobufjs";

import { DESCRIPTOR } from "./gen/descriptor";
import type { ProtoGrpcType } from "./gen/types/scheduler";
import type { SchedulerServiceClient } from "./gen/types/llmsched/v1/SchedulerService";

/** What the generated types in gen/types describe; must match TYPE_OPTIONS in scripts/gen.js. */
const LOAD_OPTIONS: protoLoader.Options = { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true };

const packageDefinition = protoLoader.fromJSON(DESCRIPTOR, LOAD_OPTIONS);
const api = grpc.loadPackageDefinition(packageDefinition) as unknown as ProtoGrpcType;

/** The generated service client class of llmsched.v1.SchedulerService. */
export const SchedulerServiceStub = api.llmsched.v1.SchedulerService;
export type { SchedulerServiceClient };

/** protobufjs types for decoding `grpc-status-details-bin` (google.rpc.Status and its details). */
const root = protobuf.Root.fromJSON(DESCRIPTOR);
export const StatusType = root.lookupType("google.rpc.Status");
export const ErrorInfoType = root.lookupType("google.rpc.ErrorInfo");
export const RetryInfoType = root.lookupType("google.rpc.RetryInfo");
