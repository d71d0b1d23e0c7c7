// Signing a person in to the viewer at a Cognito user pool's hosted UI: the authorization code
// grant with PKCE (RFC 7636, S256) for a public app client, which has no secret, so the code
// is only worth something to the tab that holds its verifier. The page says where
// (index.html's data-signin-url and data-signin-client, from viewer_assets.sign_in); without
// them, as `laneflow serve` comes, this module does nothing and no one is asked to sign in.
//
// The ID token is kept in this tab's sessionStorage (never localStorage: it leaves with the
// tab) and is sent as `Authorization` on the API's calls (app.js's `api`). app.js runs once this
// module has settled, so a page on its way to the hosted UI, or one that refused a sign-in's
// answer, never shows the viewer.

const root = document.getElementById("app");
const BASE = root.dataset.base || "";
const HOSTED = root.dataset.signinUrl || "";
const CLIENT = root.dataset.signinClient || "";

export const enabled = Boolean(HOSTED && CLIENT);

const KEY = {
  token: "laneflow-id-token",
  verifier: "laneflow-signin-verifier",
  state: "laneflow-signin-state",
  back: "laneflow-signin-back", // where the person was, to come back to
  tries: "laneflow-signin-tries", // sign-ins since the API last took a token
};
const STEPS = [KEY.verifier, KEY.state, KEY.back];
// A token this close to its end is taken as ended: a call made with it could arrive after.
const EARLY_MS = 30000;

// The viewer's own URL: the app client's callback and sign-out URL (the stack's PeopleUrl).
const viewerUrl = () => location.origin + BASE + "/";

function base64url(bytes) {
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const randomText = (bytes) => base64url(crypto.getRandomValues(new Uint8Array(bytes)));

/** The S256 code challenge of a verifier: base64url of its SHA-256, unpadded. */
export async function challengeOf(verifier) {
  return base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
}

/** A token's claims, read but not checked (API Gateway's authorizer checks the token). */
export function claimsOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0))));
  } catch (e) {
    return null;
  }
}

/** The ID token while it is good for a call; null when there is none or it has ended. */
export function idToken() {
  if (!enabled) return null;
  const token = sessionStorage.getItem(KEY.token);
  const exp = token ? (claimsOf(token) || {}).exp : undefined;
  if (token && Number.isFinite(exp) && exp * 1000 - Date.now() > EARLY_MS) return token;
  if (token) sessionStorage.removeItem(KEY.token);
  return null;
}

function say(text) {
  const p = document.createElement("p");
  p.className = "boot";
  p.textContent = text;
  root.replaceChildren(p);
}

/** Off to the hosted UI, to come back to the viewer with a code. Never settles: the page goes. */
export async function signIn() {
  const verifier = randomText(32), state = randomText(16);
  sessionStorage.setItem(KEY.verifier, verifier);
  sessionStorage.setItem(KEY.state, state);
  sessionStorage.setItem(KEY.back, location.search + location.hash);
  sessionStorage.setItem(KEY.tries, String(Number(sessionStorage.getItem(KEY.tries) || 0) + 1));
  const query = new URLSearchParams({
    response_type: "code", client_id: CLIENT, redirect_uri: viewerUrl(), scope: "openid email", state,
    code_challenge: await challengeOf(verifier), code_challenge_method: "S256",
  });
  say("Signing you in…");
  location.assign(HOSTED + "/oauth2/authorize?" + query);
  return new Promise(() => {});
}

/** Forgets the token and signs out at the hosted UI, which sends the person back here. */
export function signOut() {
  for (const key of [KEY.token, KEY.tries, ...STEPS]) sessionStorage.removeItem(key);
  location.assign(HOSTED + "/logout?" + new URLSearchParams({ client_id: CLIENT, logout_uri: viewerUrl() }));
}

/** Before a call (app.js's `api`): the token to send, null when this viewer signs no one in.
 * With none good (it ended), it signs the person in again. */
export async function authorization() {
  if (!enabled) return null;
  return idToken() || signIn();
}

/** After a call (app.js's `api`), with its status. A 401 signs the person in again, unless the
 * refused token came from a sign-in that the API has taken no token since: that would go round
 * for ever (the account may have no tenant), so the call's error is shown instead. */
export async function answered(status) {
  if (!enabled) return;
  if (status !== 401) sessionStorage.setItem(KEY.tries, "0");
  else if (Number(sessionStorage.getItem(KEY.tries) || 0) === 0) {
    sessionStorage.removeItem(KEY.token);
    await signIn();
  }
}

// A sign-in's answer that is not taken: said on a card of its own, with a way to try again.
function refuse(text) {
  const card = document.createElement("section"), head = document.createElement("h2"), p = document.createElement("p");
  const again = document.createElement("button");
  card.className = "card signin";
  card.dataset.k = "signin-refused";
  head.textContent = "Sign-in refused";
  p.textContent = text;
  again.type = "button";
  again.textContent = "Sign in again";
  again.addEventListener("click", () => signIn());
  card.append(head, p, again);
  const top = document.createElement("header"), brand = document.createElement("span"), main = document.createElement("main");
  top.className = "top";
  brand.className = "brand";
  brand.textContent = "laneflow";
  top.append(brand);
  main.append(card);
  root.replaceChildren(top, main);
  return false;
}

// The hosted UI's answer at the viewer's URL (`?code=&state=`, or `?error=`): its state must be
// the one this tab sent, and its code is redeemed with this tab's verifier.
async function callback(params) {
  const sent = sessionStorage.getItem(KEY.state), verifier = sessionStorage.getItem(KEY.verifier);
  const back = sessionStorage.getItem(KEY.back) || "";
  for (const key of STEPS) sessionStorage.removeItem(key); // each is good for one answer
  history.replaceState(null, "", BASE + "/" + back); // the code leaves the URL and the history at once
  if (params.get("error")) return refuse(`The hosted UI did not sign you in: ${params.get("error_description") || params.get("error")}.`);
  if (!sent || params.get("state") !== sent) {
    return refuse("This sign-in answer's state is not the one this tab sent, so it was refused and nothing was signed in.");
  }
  const form = { grant_type: "authorization_code", client_id: CLIENT, code: params.get("code") || "", redirect_uri: viewerUrl(), code_verifier: verifier };
  let r;
  try {
    r = await fetch(HOSTED + "/oauth2/token", { method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(form) });
  } catch (e) {
    return refuse("The hosted UI's token endpoint cannot be reached.");
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok || !body.id_token) return refuse(`The hosted UI gave no token for this sign-in: ${body.error || "HTTP " + r.status}.`);
  sessionStorage.setItem(KEY.token, body.id_token);
  return true;
}

// Who is signed in, and the way out: a strip above the viewer, outside what app.js renders.
function showSession() {
  const claims = claimsOf(sessionStorage.getItem(KEY.token)) || {};
  const bar = document.createElement("div"), who = document.createElement("span"), out = document.createElement("button");
  bar.className = "session";
  who.dataset.k = "signed-in";
  who.textContent = `Signed in as ${claims.email || claims["cognito:username"] || claims.sub || "you"}` +
    (claims["custom:tenant"] ? ` · tenant ${claims["custom:tenant"]}` : "");
  out.type = "button";
  out.textContent = "Sign out";
  out.addEventListener("click", signOut);
  bar.append(who, out);
  root.before(bar);
}

async function start() {
  if (!enabled) return true;
  const params = new URLSearchParams(location.search);
  if ((params.has("code") || params.has("error")) && !(await callback(params))) return false;
  if (!idToken()) return signIn();
  showSession();
  return true;
}

if (!(await start())) await new Promise(() => {}); // app.js waits on this module: it never renders here
