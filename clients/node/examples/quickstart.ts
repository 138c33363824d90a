// Mnemo from Node: remember a few things, recall them, page through the list.
//
//   MNEMO_ADDR=127.0.0.1:50051 MNEMO_API_KEY=mnemo_... npx tsx examples/quickstart.ts
//
// MNEMO_API_KEY may be left unset against a local-mode server (`mnemo up`).
// Prints one JSON summary line on stdout (the test suite reads it).
import { credentials, Metadata, type ServiceError } from "@grpc/grpc-js";
import { errorDetails } from "../src/errors";
import { MemoryType, ScopeKind } from "../src/gen/mnemo/v1/common";
import {
  MemoryServiceClient,
  type CreateMemoryRequest,
  type CreateMemoryResponse,
  type GetMemoryRequest,
  type GetMemoryResponse,
  type ListMemoriesRequest,
  type ListMemoriesResponse,
  type RecallRequest,
  type RecallResponse,
} from "../src/gen/mnemo/v1/memory_service";

const address = process.env.MNEMO_ADDR ?? "127.0.0.1:50051";
const apiKey = process.env.MNEMO_API_KEY;
const project = process.env.MNEMO_PROJECT ?? "node-quickstart";

// Answers may be as large as the server sends (32 MiB: a batch create is answered with its
// memories), past grpc-js's default 4 MiB a message.
const client = new MemoryServiceClient(address, credentials.createInsecure(), {
  "grpc.max_receive_message_length": 32 * 1024 * 1024,
});
const metadata = new Metadata();
if (apiKey) metadata.set("authorization", `Bearer ${apiKey}`);

function deadline(seconds: number): Date {
  return new Date(Date.now() + seconds * 1000);
}

// The generated client is callback-based; wrap the calls we use as promises.
function call<Req, Res>(
  fn: (req: Req, md: Metadata, opts: { deadline: Date }, cb: (err: ServiceError | null, res: Res) => void) => unknown,
  req: Req,
): Promise<Res> {
  return new Promise((resolve, reject) =>
    fn.call(client, req, metadata, { deadline: deadline(30) }, (err, res) => (err ? reject(err) : resolve(res))),
  );
}

async function main(): Promise<void> {
  const scope = { kind: ScopeKind.SCOPE_KIND_PROJECT, id: project };
  const facts = [
    { content: "The deploy pipeline runs on Thursdays at 14:00 UTC.", type: MemoryType.MEMORY_TYPE_SEMANTIC },
    { content: "Always tag releases with the ticket number.", type: MemoryType.MEMORY_TYPE_PROCEDURAL },
    { content: "Release 4.2 was rolled back because of a slow migration.", type: MemoryType.MEMORY_TYPE_EPISODIC },
  ];
  const created: string[] = [];
  for (const [i, f] of facts.entries()) {
    const req: CreateMemoryRequest = {
      memory: {
        id: "", externalId: `node-${i}`, scope, type: f.type, category: "release", content: f.content,
        contentHash: "", pinned: false, supersedesId: "", supersededById: "", embeddingModel: "", indexState: 0,
        metadata: { client: "node", n: i },
      },
      requestId: `node-quickstart-${project}-${i}`,
      waitForIndex: true,
    };
    const res = await call<CreateMemoryRequest, CreateMemoryResponse>(client.createMemory, req);
    created.push(res.memory!.id);
  }

  const recall = await call<RecallRequest, RecallResponse>(client.recall, {
    query: "why was a release rolled back?",
    topK: 2,
    filter: { scopes: [scope], types: [], categories: [], pinnedOnly: false, sourceSessionIds: [] },
  });

  const listed = await call<ListMemoriesRequest, ListMemoriesResponse>(client.listMemories, {
    pageSize: 2, pageToken: "", showDeleted: false,
    filter: { scopes: [scope], types: [], categories: [], pinnedOnly: false, sourceSessionIds: [] },
  });

  // A refusal's reason and the fields at fault come with the error (src/errors.ts).
  const refused = await call<GetMemoryRequest, GetMemoryResponse>(client.getMemory, { id: "external:nowhere" }).then(
    () => null,
    (err: ServiceError) => ({ code: err.code, ...errorDetails(err) }),
  );

  console.log(JSON.stringify({
    refused,
    created,
    topHit: recall.hits[0]?.memory?.content,
    topHitScores: recall.hits[0]?.scores,
    firstPage: listed.memories.map((m) => m.content),
    hasNextPage: listed.nextPageToken !== "",
  }));
  client.close();
}

main().catch((err: ServiceError) => {
  console.error(`mnemo call failed: ${err.code} ${err.details ?? err.message}`);
  client.close();
  process.exit(1);
});
