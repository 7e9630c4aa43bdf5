// Creates a container in Azurite and lists its blob names, with Azure's own SDK and Azurite's
// well-known development account. Used by tests/python_cp/test_object_stores.py.
//
//   node container.mjs create|list BLOB_ENDPOINT CONTAINER
import { BlobServiceClient, StorageSharedKeyCredential } from "@azure/storage-blob";

const ACCOUNT = "devstoreaccount1";
// Azurite's published development key (not a secret).
const KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

const [command, endpoint, container] = process.argv.slice(2);
const service = new BlobServiceClient(`${endpoint}/${ACCOUNT}`, new StorageSharedKeyCredential(ACCOUNT, KEY));
const client = service.getContainerClient(container);
if (command === "create") {
  await client.createIfNotExists();
} else if (command === "list") {
  const names = [];
  for await (const blob of client.listBlobsFlat()) names.push(blob.name);
  console.log(JSON.stringify(names));
} else {
  console.error(`unknown command ${command}: create or list`);
  process.exit(2);
}
