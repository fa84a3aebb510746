// The chat playground in a real browser: node playground.mjs URL KEY SHOTS_DIR [MESSAGE]
//
// Opens URL (the daemon's GET /) as a user would, on a desktop and on a phone, and goes
// through: the API key (asked for, then hidden), a streamed chat with its usage line, New
// chat while a reply streams (the next request holds only the new chat), Markdown
// rendering and sanitising, copy / regenerate / edit, the chats kept across a reload (switch,
// delete), an unreachable server explained, and the phone's first screen. Writes
// desktop.png and phone.png into SHOTS_DIR and prints what it saw as JSON (last line).
// Exits non-zero (with the reasons on stderr) when anything is wrong.
import { chromium } from "playwright-core";

const [url, key, shots, message = "Hello! Who are you?"] = process.argv.slice(2);
if (!url || !shots) {
  console.error("usage: node playground.mjs URL KEY SHOTS_DIR [MESSAGE]");
  process.exit(2);
}
const TIMEOUT_MS = 120_000;
const CHAT = "**/v1/chat/completions";
const problems = [];
const result = {};

function check(ok, what) {
  if (!ok) problems.push(what);
}

// A reply from a fake stream (playwright answers the request): what a model could write.
function sse(pieces) {
  const events = pieces.map((content) => ({ choices: [{ index: 0, delta: { content } }] }));
  events.push({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
  events.push({ choices: [], usage: { prompt_tokens: 9, completion_tokens: pieces.length,
    total_tokens: 9 + pieces.length } });
  return events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("") + "data: [DONE]\n\n";
}
const MARKDOWN = ["Here is **bo", "ld** text and code:\n\n```python\nprint(", "1)\n```\n\n",
  "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">\n\n",
  "Inline <img src=x onerror=\"window.pwned = 5\">, [a link](javascript:window.pwned=3), [docs](https://example.com) and ",
  "<b onclick=\"window.pwned = 4\">b</b>"];

async function open(browser, options) {
  const context = await browser.newContext({ colorScheme: "light", ...options });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT_MS);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // A refused fetch (the 401 before the key) is logged too; policy violations are bugs.
    if (m.type() === "error" && /Content.Security.Policy|Uncaught/i.test(m.text())) {
      problems.push(`console: ${m.text()}`);
    }
  });
  page.on("request", (r) => {
    if (!r.url().startsWith(new URL(url).origin) && !r.url().startsWith("data:")) {
      problems.push(`request to another origin: ${r.url()}`);
    }
  });
  page.bodies = []; // every chat request's body, in order
  page.on("request", (r) => {
    if (r.method() === "POST" && r.url().endsWith("/v1/chat/completions")) {
      page.bodies.push(JSON.parse(r.postData()));
    }
  });
  const response = await page.goto(url);
  if (response.status() !== 200) throw new Error(`GET ${url}: ${response.status()}`);
  if (key) {
    await page.getByLabel("API key").waitFor({ state: "visible" });
    await page.getByLabel("API key").fill(key);
    await page.getByRole("button", { name: "Use" }).click();
  }
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  await page.waitForFunction(() => document.getElementById("ep").textContent !== "…");
  return page;
}

// Send `text` and wait for its reply's last line (usage, "stopped" or the error).
async function send(page, text) {
  const before = await page.locator(".assistant .stats").count();
  await page.getByLabel("Message").fill(text);
  await page.getByLabel("Message").press("Enter");
  await page.locator(".assistant .stats").nth(before).waitFor({ state: "visible" });
}

const texts = (page, selector) =>
  page.locator(selector).evaluateAll((els) => els.map((e) => e.textContent));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  // -- desktop -------------------------------------------------------------------------
  const page = await open(browser, {
    viewport: { width: 1100, height: 760 },
    permissions: ["clipboard-read", "clipboard-write"],
  });
  result.keyFormHidden = await page.locator("#keyform").isHidden();
  result.model = await page.locator("#model").textContent();
  result.ep = await page.locator("#ep").textContent();

  // FIRST_ONLY: a new user's first question, at the page's defaults (the model's), and no
  // more. Otherwise greedy: the tiny model runs to the limit.
  const firstOnly = Boolean(process.env.FIRST_ONLY);
  if (!firstOnly) {
    await page.getByLabel("Temperature").fill("0");
    await page.getByLabel("Max tokens").fill(process.env.MAX_TOKENS || "48");
  }
  result.firstBody = null;
  await send(page, message);
  result.firstBody = page.bodies.at(-1);
  Object.assign(result, await page.evaluate(() => ({
    text: document.querySelector(".assistant .text").textContent,
    stats: document.querySelector(".assistant .stats").textContent,
    error: document.querySelector(".assistant.error") !== null,
    user: document.querySelector(".user .text").textContent,
  })));
  check(!result.error, `the reply failed: ${result.stats}`);
  check(result.text, "the reply is empty");
  check(/tokens\/s/.test(result.stats), `no tokens/s in "${result.stats}"`);
  check(result.user === message, `the message shown is "${result.user}"`);
  if (firstOnly) {
    result.problems = problems;
    console.log(JSON.stringify(result));
    await browser.close();
    process.exit(problems.length ? 1 : 0);
  }

  // New chat while a long reply streams (in the chat so far): the page is free at once and
  // empty, the next request carries the new chat alone.
  await page.getByLabel("Max tokens").fill("2000");
  // The click comes from the page at the reply's second update: the tiny model writes its
  // 2000 tokens in about a second, which a round trip from here could miss.
  await page.evaluate(() => {
    const log = document.getElementById("log");
    let updates = 0;
    const observer = new MutationObserver((records) => {
      if (!records.some((r) => r.target.matches && r.target.matches(".assistant .text"))) return;
      if (++updates < 2) return;
      observer.disconnect();
      document.getElementById("newchat").click();
      // What the page shows right after the click (the old reply would still be coming).
      window.afterNewChat = {
        messages: document.querySelectorAll("#log .msg").length,
        sendDisabled: document.getElementById("send").disabled,
        stopShown: !document.getElementById("abort").hidden,
      };
      window.updatesBeforeNewChat = updates;
    });
    observer.observe(log, { childList: true, subtree: true });
  });
  await page.getByLabel("Message").fill("Tell me a very long story");
  await page.getByLabel("Message").press("Enter");
  await page.waitForFunction(() => window.updatesBeforeNewChat);
  result.deltas = await page.evaluate(() => window.updatesBeforeNewChat);
  result.afterNewChat = await page.evaluate(() => window.afterNewChat);
  await page.getByLabel("Max tokens").fill("16");
  await send(page, "Hi");
  result.hiBody = page.bodies.at(-1);
  result.hiLog = await texts(page, "#log .msg .text");

  // Markdown (a reply playwright makes up): rendered, and nothing in it runs.
  await page.route(CHAT, (route) => route.fulfill({
    status: 200, contentType: "text/event-stream", body: sse(MARKDOWN),
  }));
  await send(page, "Some markdown please");
  await page.unroute(CHAT);
  const reply = page.locator(".assistant").last();
  result.markdown = await reply.evaluate((el) => ({
    strong: [...el.querySelectorAll(".text strong")].map((e) => e.textContent),
    code: [...el.querySelectorAll(".text pre > code")].map((e) => e.textContent),
    text: el.querySelector(".text").textContent,
    elements: [...el.querySelectorAll(".text *")].map((e) => e.tagName.toLowerCase()),
    handlers: [...el.querySelectorAll(".text *")].flatMap((e) =>
      [...e.attributes].map((a) => a.name).filter((n) => n.startsWith("on"))),
    links: [...el.querySelectorAll(".text a")].map((a) =>
      [a.getAttribute("href"), a.getAttribute("target"), a.getAttribute("rel")]),
    pwned: window.pwned ?? null,
    scripts: document.querySelectorAll("#log script, #log img").length,
  }));
  await page.waitForTimeout(200); // an onerror would have fired by now
  result.markdown.pwnedLater = await page.evaluate(() => window.pwned ?? null);

  // Copy gives the reply's Markdown as written.
  await reply.locator(".actions").getByRole("button", { name: "Copy" }).click();
  result.copied = await page.evaluate(() => navigator.clipboard.readText());

  // Regenerate the made-up reply (by the model this time): the same question again, the
  // old answer gone.
  await reply.getByRole("button", { name: "Regenerate" }).click();
  await page.locator(".assistant").nth(1).locator(".stats").waitFor({ state: "visible" });
  result.regenerateBody = page.bodies.at(-1);
  result.regenerateLog = await texts(page, "#log .msg.user .text");

  // Edit the first message: the chat restarts from it.
  await page.locator(".user").first().getByRole("button", { name: "Edit" }).click();
  await page.getByLabel("Edited text").fill("Hello again");
  await page.locator(".user").first().getByRole("button", { name: "Send" }).click();
  await page.locator(".assistant .stats").first().waitFor({ state: "visible" });
  await page.waitForFunction(() => document.getElementById("send").disabled === false);
  result.editBody = page.bodies.at(-1);
  result.editLog = await texts(page, "#log .msg .text");

  // Kept across a reload: the chats, the one on screen with its stats; the stopped one.
  const chatsBefore = await texts(page, "#chats .chat-open");
  const logBefore = await texts(page, "#log .msg .text");
  await page.reload();
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  result.reload = {
    chatsBefore,
    chats: await texts(page, "#chats .chat-open"),
    same: JSON.stringify(await texts(page, "#log .msg .text")) === JSON.stringify(logBefore),
    stats: await page.locator("#log .stats").count(),
  };
  await page.locator("#chats .chat-open", { hasText: message }).click();
  result.stopped = {
    log: await texts(page, "#log .msg .text"),
    stats: await texts(page, "#log .stats"),
  };
  const del = page.getByRole("button", { name: `Delete chat: ${message}` });
  await del.click();
  await del.click(); // the second click deletes
  await page.reload();
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  result.afterDelete = await texts(page, "#chats .chat-open");

  // The server cannot be reached: said in plain words.
  await page.route(CHAT, (route) => route.abort("connectionrefused"));
  await send(page, "Are you there?");
  await page.unroute(CHAT);
  result.unreachable = await page.locator(".assistant.error .stats").last().textContent();
  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Max tokens").fill(process.env.MAX_TOKENS || "48");
  await page.route(CHAT, (route) => route.fulfill({
    status: 200, contentType: "text/event-stream", body: sse(MARKDOWN.slice(0, 3)),
  }));
  await send(page, "Show me a code block");
  await page.unroute(CHAT);
  await page.screenshot({ path: `${shots}/desktop.png` });

  // -- phone ---------------------------------------------------------------------------
  const phone = await open(browser, {
    viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true,
  });
  await send(phone, message);
  result.phone = await phone.evaluate(() => {
    const box = (id) => document.getElementById(id).getBoundingClientRect();
    const last = [...document.querySelectorAll("#log .msg")].at(-1).getBoundingClientRect();
    const log = box("log");
    return {
      prompt: box("prompt").toJSON(), send: box("send").toJSON(),
      height: window.innerHeight, width: window.innerWidth,
      pageScrolls: document.documentElement.scrollHeight > window.innerHeight + 1,
      lastVisible: last.bottom > log.top && last.top < log.bottom,
      settingsOpen: document.getElementById("settings").open,
      chatsOpen: document.getElementById("chatsbox").open,
      keyFormHidden: document.getElementById("keyform").hidden,
    };
  });
  await phone.screenshot({ path: `${shots}/phone.png` });
  result.problems = problems;
  console.log(JSON.stringify(result));
  if (problems.length) {
    console.error(problems.join("\n"));
    process.exitCode = 1;
  }
} catch (e) {
  console.log(JSON.stringify({ ...result, problems }));
  throw e;
} finally {
  await browser.close();
}
