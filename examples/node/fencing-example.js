// A Node.js service on the fencing coordinator's gRPC API, with no client library of ours:
// worker-a takes a lease and stalls past it, worker-b takes over and writes, then worker-a's
// late write is refused STALE_TOKEN with the high-water mark, read from the error's details.
// Run: npm ci && node fencing-example.js 127.0.0.1:7100 (any member: followers forward).
'use strict';
const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

// The wire contract: in a checkout, or beside an installed package (README "From any language").
const PROTO = process.env.FENCING_PROTO || path.join(__dirname, '../../coordinator/api/v1/fencing.proto');
const fencing = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, {keepCase: true, longs: String})).fencing.v1;
const endpoint = process.argv[2] || '127.0.0.1:7100';
const lease = new fencing.Lease(endpoint, grpc.credentials.createInsecure());
const store = new fencing.FencedStore(endpoint, grpc.credentials.createInsecure());

// A refusal's reason and details: trailer grpc-status-details-bin is a google.rpc.Status whose
// details hold a google.rpc.ErrorInfo (the field numbers of googleapis' google/rpc/*.proto).
const rpc = protobuf.parse(`syntax = "proto3";
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }`,
{keepCase: true}).root;

function refusal(err) {
  const [bin] = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  const detail = bin && rpc.lookupType('Status').decode(bin).details
    .find((d) => d.type_url === 'type.googleapis.com/google.rpc.ErrorInfo');
  const {reason, metadata} = detail ? rpc.lookupType('ErrorInfo').decode(detail.value) : {};
  return {code: grpc.status[err.code], reason, metadata, message: err.details};
}

// Every mutation carries an op_id: 16-64 random bytes, new per operation; resend the same one
// only to retry that operation (after a lost answer or OUTCOME_UNKNOWN), so it applies once.
const newOpId = () => crypto.randomBytes(16);

const call = (client, method, request) => new Promise((resolve, reject) => {
  client[method](request, {deadline: Date.now() + 10000}, (err, res) => (err ? reject(err) : resolve(res)));
});

async function main() {
  const resource = `orders/${crypto.randomBytes(4).toString('hex')}`;
  const a = await call(lease, 'Acquire', {resource, holder: 'worker-a', ttl_ms: 500, op_id: newOpId()});
  console.log(`worker-a: token ${a.token} for ${resource}`);
  // worker-a stalls. worker-b asks, and the cluster grants it once worker-a's lease expires.
  const b = await call(lease, 'Acquire', {resource, holder: 'worker-b', ttl_ms: 10000, op_id: newOpId(),
    wait_ms: 5000});
  console.log(`worker-b: token ${b.token}`);
  const w = await call(store, 'Write', {resource, key: 'total', value: Buffer.from('42'), token: b.token,
    op_id: newOpId()});
  console.log(`worker-b: wrote total=42 with token ${b.token}: version ${w.version}`);
  try {
    await call(store, 'Write', {resource, key: 'total', value: Buffer.from('17'), token: a.token, op_id: newOpId()});
    throw new Error('the stale write was applied');
  } catch (err) {
    const {code, reason, metadata} = refusal(err);
    if (reason !== 'STALE_TOKEN') throw err;  // anything else is not the refusal shown here
    console.log(`worker-a: write refused: ${code} ${reason}, hwm ${metadata.hwm}`);
  }
  const r = await call(store, 'Read', {resource, key: 'total'});
  console.log(`read: total=${r.value} version ${r.version} hwm ${r.hwm}`);
  await call(lease, 'Release', {resource, token: b.token, op_id: newOpId()});
}

main().then(() => process.exit(0), (err) => {
  console.error(`fencing-example: ${err.message}`);
  process.exit(1);
});
