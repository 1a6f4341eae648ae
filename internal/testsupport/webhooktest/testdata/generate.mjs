// generate.mjs writes official.json: deliveries signed, and verdicts given,
// by the providers' own JavaScript libraries, for package webhooktest, which
// the webhook and httpapi tests check jetflow's verifier against. CI does
// not run it; run it in this folder again after changing a case:
//
//   npm install standardwebhooks@1.1.1 @octokit/webhooks-methods@6.0.0
//   node generate.mjs > official.json
//
// Everything is fixed (secrets, IDs, bodies, timestamps, and the clock the
// libraries verify against), so the output is the same on every run.
import { createRequire } from "node:module";
import { sign as ghSign, verifyWithFallback } from "@octokit/webhooks-methods";

const require = createRequire(import.meta.url);
const { Webhook } = require("standardwebhooks");

const now = 1700000000; // the verifiers' clock, unix seconds
Date.now = () => now * 1000;

const b64 = (s) => Buffer.from(s).toString("base64");
const std = {
  current: "whsec_" + b64("jetflow-fixture-standard-current"),
  rotated: "whsec_" + b64("jetflow-fixture-standard-rotated"),
  wrong: "whsec_" + b64("jetflow-fixture-standard-wrong-0"),
};
const gh = { current: "jetflow-fixture-github-current", rotated: "jetflow-fixture-github-rotated", wrong: "jetflow-fixture-github-wrong" };

const body = JSON.stringify({ type: "invoice.paid", data: { id: "in_1", amount: 100 } });
const longID = "msg_" + "x".repeat(296); // 300 characters: too long for a run ID

// standardCase signs with the library and records whether the library
// accepts the delivery with the signature header changed by edit, for a
// verifier holding any of the secrets named in verifyWith.
function standardCase(name, { id = "msg_2Lx0a9", ts = now - 30, sentTS = String(ts), signWith = ["current"], verifyWith = ["current"], edit = (h) => h, payload = body, sent = payload } = {}) {
  const header = signWith.map((s) => new Webhook(std[s]).sign(id, new Date(ts * 1000), payload)).join(" ");
  const signature = edit(header);
  const headers = { "webhook-id": id, "webhook-timestamp": sentTS, "webhook-signature": signature };
  let accepted = false;
  for (const s of verifyWith) {
    try {
      new Webhook(std[s]).verify(sent, headers);
      accepted = true;
    } catch (e) {
      if (e.name !== "WebhookVerificationError" && !(e instanceof SyntaxError)) throw e;
    }
  }
  return { name, secrets: verifyWith.map((s) => std[s]), headers, body: sent, accepted };
}

const standard = [
  standardCase("valid"),
  standardCase("event ID with dot and colon", { id: "msg.2024-01-01:a/b" }),
  standardCase("event ID too long for a run ID", { id: longID }),
  standardCase("event ID starting with =", { id: "=msg_1" }),
  standardCase("rotation: old and new signatures, verifier has the new secret", { signWith: ["rotated", "current"] }),
  standardCase("rotation: signed with the old secret, verifier has both", { signWith: ["rotated"], verifyWith: ["current", "rotated"] }),
  standardCase("unparseable v1 entry before a valid one", { edit: (h) => "v1,@@@@ " + h }),
  standardCase("entry without a version before a valid one", { edit: (h) => "garbage " + h }),
  standardCase("bare v1 after a valid one", { edit: (h) => h + " v1" }),
  standardCase("other version beside a valid one", { edit: (h) => "v2,AAAA " + h + " v1a,BBBB" }),
  standardCase("valid entry with a trailing field", { edit: (h) => h + ",extra" }),
  standardCase("only unparseable entries", { edit: () => "v1,@@@@ garbage v1" }),
  standardCase("tampered signature", { edit: (h) => h.slice(0, 3) + (h[3] === "A" ? "B" : "A") + h.slice(4) }),
  standardCase("tampered body", { sent: body.replace("100", "999") }),
  standardCase("wrong secret", { verifyWith: ["wrong"] }),
  standardCase("oldest accepted timestamp", { ts: now - 300 }),
  standardCase("stale timestamp", { ts: now - 301 }),
  standardCase("newest accepted timestamp", { ts: now + 300 }),
  standardCase("future timestamp", { ts: now + 301 }),
  standardCase("timestamp with a leading zero", { sentTS: "0" + String(now - 30) }),
];

// githubCase does the same for @octokit/webhooks-methods; the delivery ID
// is not signed, so it is fixed.
async function githubCase(name, { signWith = "current", verifyWith = ["current"], edit = (h) => h, sent = body } = {}) {
  const signature = edit(await ghSign(gh[signWith], body));
  const [first, ...rest] = verifyWith.map((s) => gh[s]);
  const accepted = await verifyWithFallback(first, sent, signature, rest);
  return {
    name,
    secrets: verifyWith.map((s) => gh[s]),
    headers: { "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958", "x-github-event": "issues", "x-hub-signature-256": signature },
    body: sent,
    accepted,
  };
}

const github = [
  await githubCase("valid"),
  await githubCase("rotation: signed with the old secret, verifier has both", { signWith: "rotated", verifyWith: ["current", "rotated"] }),
  await githubCase("tampered body", { sent: body.replace("100", "999") }),
  await githubCase("wrong secret", { verifyWith: ["wrong"] }),
  await githubCase("sha1 prefix", { edit: (h) => h.replace("sha256=", "sha1=") }),
  await githubCase("no prefix", { edit: (h) => h.replace("sha256=", "") }),
  await githubCase("truncated", { edit: (h) => h.slice(0, -2) }),
  await githubCase("upper-case hex", { edit: (h) => "sha256=" + h.slice(7).toUpperCase() }),
];

const versions = {
  standardwebhooks: require("standardwebhooks/package.json").version,
  "@octokit/webhooks-methods": ghSign.VERSION,
};
process.stdout.write(JSON.stringify({ generated_by: "generate.mjs", versions, now, standard, github }, null, 2) + "\n");
