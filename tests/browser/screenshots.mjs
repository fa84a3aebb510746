// The playground screenshots of docs/api.md: node screenshots.mjs URL OUT_DIR [QUESTION...]
//
// Against a served real model (e.g. `ortserve serve --model-dir` a SmolLM2-135M-Instruct
// bake), asks each QUESTION in one chat on a desktop-sized page and writes
// OUT_DIR/playground-desktop.png, then asks the last one on a phone-sized page and writes
// OUT_DIR/playground-phone.png (temperature 0.7, seed $SEED or 3). Not a test:
// tests/functional/test_playground.py is.
import { chromium } from "playwright-core";

const [url, out, ...asked] = process.argv.slice(2);
if (!url || !out) {
  console.error("usage: node screenshots.mjs URL OUT_DIR [QUESTION...]");
  process.exit(2);
}
const questions = asked.length ? asked : [
  "What is the capital of France?",
  "Write a Python function that adds two numbers.",
];

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
});

async function chat(options, asks, path) {
  const context = await browser.newContext({ colorScheme: "light", ...options });
  // The page's saved settings: sampled, with a seed, so that a rerun gives the same replies.
  const settings = { temperature: "0.7", max_tokens: "300", seed: process.env.SEED || "3" };
  await context.addInitScript((values) => {
    localStorage.setItem("ortserve.settings", JSON.stringify(values));
  }, settings);
  const page = await context.newPage();
  page.setDefaultTimeout(120_000);
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  for (const [i, question] of asks.entries()) {
    await page.getByLabel("Message").fill(question);
    await page.getByLabel("Message").press("Enter");
    await page.locator(".assistant .stats").nth(i).waitFor({ state: "visible" });
  }
  await page.locator("#log").evaluate((log) => { log.scrollTop = log.scrollHeight; });
  await page.screenshot({ path });
  await context.close();
}

try {
  await chat({ viewport: { width: 1100, height: 760 } }, questions,
    `${out}/playground-desktop.png`);
  await chat({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true },
    questions.slice(-1), `${out}/playground-phone.png`);
} finally {
  await browser.close();
}
