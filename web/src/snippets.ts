// "How to call this deployment": ready-to-paste `curl`, `tritonclient` (HTTP and gRPC) and
// `tessera` CLI snippets for a deployment's gateway endpoint. Pure: unit-tested.

import type { components } from './api/schema';

type Endpoint = components['schemas']['InferenceEndpoint'];

/** One snippet: a tab label and the text to paste. */
export interface Snippet {
  id: 'curl' | 'python-http' | 'python-grpc' | 'cli';
  label: string;
  text: string;
}

/** `host:port` and whether TLS is on, from the endpoint's HTTP model URL. */
export function httpHost(http: string): { host: string; ssl: boolean } {
  const cut = http.indexOf('/v2/models/');
  const base = cut >= 0 ? http.slice(0, cut) : http;
  return { host: base.replace(/^https?:\/\//, '').replace(/\/+$/, ''), ssl: base.startsWith('https://') };
}

/** The snippets for an endpoint; `controlPlane` is the console's origin (for the CLI) and
 *  `tenant` the deployment's tenant. The key is read from `$TESSERA_KEY`, never embedded. */
export function callSnippets(e: Endpoint, tenant: string, controlPlane: string): Snippet[] {
  const { host, ssl } = httpHost(e.http);
  const model = e.model;
  const out: Snippet[] = [
    {
      id: 'curl',
      label: 'curl',
      text: [
        `curl -s ${e.http}/infer \\`,
        `  -H "Authorization: Bearer $TESSERA_KEY" -H 'Content-Type: application/json' \\`,
        `  -d '{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [...]}]}'`,
      ].join('\n'),
    },
    {
      id: 'python-http',
      label: 'tritonclient HTTP',
      text: python('http', host, ssl, model, 'Authorization'),
    },
  ];
  if (e.grpc) {
    const g = e.grpc.replace(/^grpcs?:\/\//, '');
    out.push({ id: 'python-grpc', label: 'tritonclient gRPC', text: python('grpc', g, ssl, model, 'authorization') });
  }
  out.push({
    id: 'cli',
    label: 'tessera CLI',
    text: [
      `export TESSERA_URL=${controlPlane} TESSERA_TENANT=${tenant} TESSERA_API_KEY=$TESSERA_KEY`,
      `tessera infer --model ${model} --input @request.json   # KServe v2 JSON in, JSON out`,
    ].join('\n'),
  });
  return out;
}

/** A tritonclient script: metadata first (it names the inputs), then one inference. gRPC
 *  metadata keys must be lower case, so the gRPC script sends `authorization`. */
function python(kind: 'http' | 'grpc', host: string, ssl: boolean, model: string, header: string): string {
  const mod = kind === 'http' ? 'httpclient' : 'grpcclient';
  return [
    'import os',
    'import numpy as np',
    `import tritonclient.${kind} as ${mod}`,
    '',
    `headers = {"${header}": f"Bearer {os.environ['TESSERA_KEY']}"}`,
    `client = ${mod}.InferenceServerClient("${host}"${ssl ? ', ssl=True' : ''})`,
    `print(client.get_model_metadata("${model}", headers=headers))  # names, datatypes and shapes of the inputs`,
    `x = ${mod}.InferInput("INPUT0", [1, 16], "INT32")  # one per input of the metadata`,
    'x.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))',
    `result = client.infer("${model}", [x], headers=headers)`,
    'print(result.get_response())',
  ].join('\n');
}
