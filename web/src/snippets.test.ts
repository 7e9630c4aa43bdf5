import { describe, expect, it } from 'vitest';
import { callSnippets, httpHost } from './snippets';

describe('call snippets', () => {
  const endpoint = { http: 'https://infer.example.com:9000/v2/models/simple', grpc: 'infer.example.com:9001', model: 'simple' };
  it('finds the host of the HTTP endpoint', () => {
    expect(httpHost(endpoint.http)).toEqual({ host: 'infer.example.com:9000', ssl: true });
    expect(httpHost('http://127.0.0.1:9000/v2/models/m')).toEqual({ host: '127.0.0.1:9000', ssl: false });
  });
  it('offers curl, tritonclient HTTP and gRPC, and the CLI', () => {
    const s = callSnippets(endpoint, 'demo', 'https://tessera.example.com');
    expect(s.map((x) => x.id)).toEqual(['curl', 'python-http', 'python-grpc', 'cli']);
    const [curl, http, grpc, cli] = s.map((x) => x.text);
    expect(curl).toContain('curl -s https://infer.example.com:9000/v2/models/simple/infer');
    expect(curl).toContain('Authorization: Bearer $TESSERA_KEY');
    expect(http).toContain('import tritonclient.http as httpclient');
    expect(http).toContain('httpclient.InferenceServerClient("infer.example.com:9000", ssl=True)');
    expect(http).toContain('headers = {"Authorization"');
    // gRPC metadata keys are lower case.
    expect(grpc).toContain('grpcclient.InferenceServerClient("infer.example.com:9001", ssl=True)');
    expect(grpc).toContain('headers = {"authorization"');
    expect(cli).toContain('TESSERA_URL=https://tessera.example.com TESSERA_TENANT=demo');
    expect(cli).toContain('tessera infer --model simple');
  });
  it('leaves gRPC out when the endpoint has none, and never embeds a key', () => {
    const s = callSnippets({ ...endpoint, grpc: null }, 'demo', 'http://localhost:8080');
    expect(s.map((x) => x.id)).toEqual(['curl', 'python-http', 'cli']);
    expect(s.some((x) => x.text.includes('tsk_'))).toBe(false);
  });
});
