// A small Markdown renderer that builds DOM nodes and sets only textContent:
// model output is untrusted, and no string of it is ever parsed as HTML, so
// a <script> or an onerror= in an answer is shown as the characters it is.
// It covers what chat answers use: fenced code (with a copy button),
// headings, lists, quotes, rules, paragraphs, `code`, **bold**, *em* and
// links (http, https and mailto only).

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+?)\*\*|(?<!\w)__([^_\s][^_]*?)__(?!\w)|\*([^*\s][^*]*?)\*|\[([^\]\n]+)\]\(([^)\s]+)\)/g;
const SAFE_URL = /^(https?:|mailto:)/i;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) parent.append(el("code", null, m[2].trim() || m[2]));
    else if (m[3] || m[4]) inline(parent.appendChild(el("strong")), m[3] || m[4]);
    else if (m[5]) inline(parent.appendChild(el("em")), m[5]);
    else if (SAFE_URL.test(m[7])) {
      const a = el("a");
      a.href = m[7];
      a.rel = "noopener noreferrer";
      a.target = "_blank";
      inline(a, m[6]);
      parent.append(a);
    } else parent.append(document.createTextNode(m[0]));
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

export function codeBlock(code, lang) {
  const wrap = el("div", "code");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || "text"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", () => copyText(code, copy));
  bar.append(copy);
  const pre = el("pre");
  pre.append(el("code", null, code));
  wrap.append(bar, pre);
  return wrap;
}

const BLOCK_START = /^(```|~~~|#{1,6}\s|>|\s*[-*+]\s+|\s*\d+[.)]\s+|(\*\s*){3,}$|(-\s*){3,}$)/;

function list(lines, i, ordered) {
  const item = ordered ? /^\s*\d+[.)]\s+(.*)$/ : /^\s*[-*+]\s+(.*)$/;
  const node = el(ordered ? "ol" : "ul");
  while (i < lines.length && item.test(lines[i])) {
    inline(node.appendChild(el("li")), lines[i].match(item)[1]);
    i++;
  }
  return [node, i];
}

function fence(lines, i) {
  const open = lines[i].match(/^(```|~~~)\s*([\w+#.-]*)/);
  const body = [];
  i++;
  while (i < lines.length && !lines[i].startsWith(open[1])) body.push(lines[i++]);
  return [codeBlock(body.join("\n"), open[2]), i + 1];  // an open fence runs to the end
}

function block(lines, i) {
  const line = lines[i];
  if (/^(```|~~~)/.test(line)) return fence(lines, i);
  const h = line.match(/^(#{1,6})\s+(.*)$/);
  if (h) {
    const node = el("h" + Math.min(h[1].length + 2, 6));
    inline(node, h[2]);
    return [node, i + 1];
  }
  if (/^((\*\s*){3,}|(-\s*){3,})$/.test(line.trim())) return [el("hr"), i + 1];
  if (/^\s*[-*+]\s+/.test(line)) return list(lines, i, false);
  if (/^\s*\d+[.)]\s+/.test(line)) return list(lines, i, true);
  if (line.startsWith(">")) {
    const quoted = [];
    while (i < lines.length && lines[i].startsWith(">")) quoted.push(lines[i++].replace(/^>\s?/, ""));
    const node = el("blockquote");
    render(node, quoted.join("\n"));
    return [node, i];
  }
  const para = [];
  while (i < lines.length && lines[i].trim() && (!para.length || !BLOCK_START.test(lines[i]))) {
    para.push(lines[i++]);
  }
  const node = el("p");
  para.forEach((text, n) => {
    if (n) node.append(el("br"));
    inline(node, text);
  });
  return [node, i];
}

// Replace `target`'s children with `text` rendered as Markdown.
export function render(target, text) {
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  const nodes = [];
  let i = 0;
  while (i < lines.length) {
    if (!lines[i].trim()) {
      i++;
      continue;
    }
    const [node, next] = block(lines, i);
    nodes.push(node);
    i = next;
  }
  target.replaceChildren(...nodes);
}
