// The chat playground in a real browser: node playground.mjs URL KEY SCREENSHOT [MESSAGE]
//
// Opens URL (the daemon's GET /), enters the API key when the page asks for one, sends
// MESSAGE, waits for the streamed reply and its usage line, checks them, writes a
// screenshot and prints {"text", "deltas", "model", "ep", "stats"} as JSON.
// Exits non-zero (with the reason on stderr) when anything is missing.
import { chromium } from "playwright-core";

const [url, key, screenshot, message = "Hello! Who are you?"] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error("usage: node playground.mjs URL KEY SCREENSHOT [MESSAGE]");
  process.exit(2);
}
const TIMEOUT_MS = 120_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 }, colorScheme: "light" });
  page.setDefaultTimeout(TIMEOUT_MS);
  const problems = [];
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

  const response = await page.goto(url);
  if (response.status() !== 200) throw new Error(`GET ${url}: ${response.status()}`);
  if (key) {
    await page.getByLabel("API key").waitFor({ state: "visible" });
    await page.getByLabel("API key").fill(key);
    await page.getByRole("button", { name: "Use" }).click();
  }
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  await page.waitForFunction(() => document.getElementById("ep").textContent !== "…");

  // Count the reply's updates in the page: more than one means it streamed.
  await page.evaluate(() => {
    window.deltas = 0;
    new MutationObserver((records) => {
      for (const r of records) {
        const el = r.target.nodeType === Node.ELEMENT_NODE ? r.target : r.target.parentElement;
        if (el && el.matches(".assistant .text")) window.deltas += 1;
      }
    }).observe(document.getElementById("log"), { childList: true, characterData: true, subtree: true });
  });
  await page.getByLabel("Max tokens").fill(process.env.MAX_TOKENS || "48");
  await page.getByLabel("Message").fill(message);
  await page.getByLabel("Message").press("Enter");

  const stats = page.locator(".assistant .stats");
  await stats.waitFor({ state: "visible" });
  const result = await page.evaluate(() => ({
    text: document.querySelector(".assistant .text").textContent,
    deltas: window.deltas,
    model: document.getElementById("model").textContent,
    ep: document.getElementById("ep").textContent,
    stats: document.querySelector(".assistant .stats").textContent,
    error: document.querySelector(".assistant.error") !== null,
    user: document.querySelector(".user .text").textContent,
  }));
  await page.screenshot({ path: screenshot });
  if (result.error) problems.push(`the reply failed: ${result.stats}`);
  if (!result.text) problems.push("the reply is empty");
  if (!/tokens\/s/.test(result.stats)) problems.push(`no tokens/s in "${result.stats}"`);
  if (result.user !== message) problems.push(`the message shown is "${result.user}"`);
  console.log(JSON.stringify(result));
  if (problems.length) {
    console.error(problems.join("\n"));
    process.exitCode = 1;
  }
} finally {
  await browser.close();
}
