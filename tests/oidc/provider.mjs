// A real OpenID Connect provider (the `oidc-provider` package) for Tessera's single sign-on
// tests, on a loopback port.
//
//   node provider.mjs --client-id tessera --client-secret S --redirect-uri URL [--port 0]
//
// Prints one JSON line `{"issuer": "http://127.0.0.1:PORT"}` on stdout once it listens.
// Sign-in uses the package's development login form: any login (taken as the email address)
// and any password. Accounts listed in `--accounts '{"a@x": {"groups": ["admins"]}}'` get
// those groups; others get none. The grant is given without a consent page (first-party).
//
// Test controls (loopback only, never in a real provider):
//   POST /__test/id-token-audience?aud=X  re-signs the ID tokens the token endpoint returns
//                                          with audience X (empty: stop), to test that a
//                                          client refuses tokens meant for someone else.
import http from 'node:http';
import { parseArgs } from 'node:util';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    'client-id': { type: 'string', default: 'tessera' },
    'client-secret': { type: 'string', default: 'tessera-secret' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
    accounts: { type: 'string', default: '{}' },
  },
});
const accounts = JSON.parse(args.accounts);

// The signing key is ours, so the test control can re-sign tokens with it.
const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const signingJwk = { ...(await jose.exportJWK(privateKey)), kid: 'test-key-1', alg: 'RS256', use: 'sig' };
let idTokenAudience = '';

const server = http.createServer();
await new Promise((resolve) => server.listen(Number(args.port), '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: args['client-id'],
      client_secret: args['client-secret'],
      redirect_uris: args['redirect-uri'],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
  ],
  jwks: { keys: [signingJwk] },
  cookies: { keys: ['tessera-test-oidc-cookie-key'] },
  pkce: { required: () => true },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  // Claims in the ID token itself, not only from the userinfo endpoint.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  async findAccount(_ctx, id) {
    return {
      accountId: id,
      async claims() {
        const extra = accounts[id] ?? {};
        return { sub: id, email: id, email_verified: true, name: extra.name ?? id, groups: extra.groups ?? [] };
      },
    };
  },
  // First-party client: grant what it asks for instead of showing a consent page.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email profile groups');
    grant.addOIDCClaims(['email', 'email_verified', 'name', 'groups']);
    await grant.save();
    return grant;
  },
});

provider.use(async (ctx, next) => {
  if (ctx.path === '/__test/id-token-audience' && ctx.method === 'POST') {
    idTokenAudience = ctx.query.aud ?? '';
    ctx.status = 204;
    return;
  }
  await next();
  if (idTokenAudience && ctx.path === '/token' && ctx.status === 200 && ctx.body?.id_token) {
    const claims = jose.decodeJwt(ctx.body.id_token);
    ctx.body.id_token = await new jose.SignJWT({ ...claims, aud: idTokenAudience })
      .setProtectedHeader({ alg: 'RS256', kid: signingJwk.kid })
      .sign(privateKey);
  }
});

server.on('request', provider.callback());
process.stdout.write(`${JSON.stringify({ issuer })}\n`);
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
