// Streams one generation and prints its events as they come:
//   LLMSCHED_ADDRESS=127.0.0.1:50051 LLMSCHED_API_KEY=... node dist/examples/stream.js "Tell me a story"
// (LLMSCHED_USER instead of a key where the scheduler has no API keys; LLMSCHED_MODEL picks the model.)
import { SchedulerClient, SchedulerError } from "../src";

async function main(): Promise<void> {
  const env = process.env;
  const client = new SchedulerClient({
    address: env.LLMSCHED_ADDRESS ?? "127.0.0.1:50051",
    ...(env.LLMSCHED_API_KEY ? { apiKey: env.LLMSCHED_API_KEY } : { userId: env.LLMSCHED_USER ?? "demo" }),
  });
  const controller = new AbortController();
  process.once("SIGINT", () => controller.abort()); // Ctrl-C leaves the queue or stops the engine
  const request = { model: env.LLMSCHED_MODEL ?? "tiny", prompt: process.argv[2] ?? "Hello", maxTokens: 8, ignoreEos: true };
  try {
    for await (const event of client.stream(request, { signal: controller.signal, timeoutMs: 60_000 })) {
      switch (event.type) {
        case "queued":
          console.log(`queued position=${event.positionInUserQueue} depth=${event.modelQueueDepth} eta=${event.estimatedWaitMs ?? "?"}ms`);
          break;
        case "dispatched":
          console.log(`dispatched to ${event.backend} after ${Math.round(event.queueWaitMs ?? 0)} ms in the queue`);
          break;
        case "delta":
          process.stdout.write(event.text);
          break;
        case "finished":
          console.log(`\nfinished (${event.finishReason}): ${event.usage.completionTokens} tokens in ${Math.round(event.timings.totalMs ?? 0)} ms`);
          break;
      }
    }
  } catch (error) {
    if (!(error instanceof SchedulerError)) throw error;
    const hint = error.retryDelayMs !== undefined ? `, retry after ${Math.round(error.retryDelayMs)} ms` : "";
    console.error(`failed: ${error.codeName} ${error.reason ?? ""}${hint}: ${error.details}`);
    process.exitCode = 1;
  } finally {
    client.close();
  }
}

void main();
