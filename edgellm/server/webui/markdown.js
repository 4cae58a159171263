// Markdown to DOM nodes for untrusted text (a model's reply, an imported file). Every piece of text
// becomes a text node (textContent), never HTML: `<script>` or `<img onerror=...>` in a reply shows as
// those characters. Links keep only http(s) URLs; anything else (javascript:, data:) stays plain text.
// The subset: fenced code blocks (with a copy button), headings, lists, block quotes, rules, paragraphs;
// inline code, bold, italic, links and bare URLs. Unfinished syntax (a reply mid-stream) renders as text.

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function safeUrl(raw) {
  try {
    const url = new URL(raw);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null; // relative or malformed: not a link
  }
}

function link(text, href) {
  const a = el("a", null, text);
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  return a;
}

// One pattern for every inline form; the first match wins, its group says which form it is.
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(\S(?:[\s\S]*?\S)?)\*\*|__(\S(?:[\s\S]*?\S)?)__|\*(\S(?:[^*]*?\S)?)\*|\b_(\S(?:[^_]*?\S)?)_\b|\[([^\]\n]+)\]\(([^)\s]+)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/;

export function renderInline(text, parent) {
  let rest = text;
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) break;
    if (m.index) parent.append(document.createTextNode(rest.slice(0, m.index)));
    if (m[1]) parent.append(el("code", null, m[2]));
    else if (m[3] || m[4]) renderInline(m[3] || m[4], parent.appendChild(el("strong")));
    else if (m[5] || m[6]) renderInline(m[5] || m[6], parent.appendChild(el("em")));
    else {
      const [label, raw] = m[7] ? [m[7], m[8]] : [m[9], m[9]];
      const href = safeUrl(raw);
      parent.append(href ? link(label, href) : document.createTextNode(m[0]));
    }
    rest = rest.slice(m.index + m[0].length);
  }
  if (rest) parent.append(document.createTextNode(rest));
}

export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  // A plain-http page on another host has no clipboard API: the selection and the old command.
  const area = el("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

function codeBlock(lang, code) {
  const box = el("div", "code-block");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || "text"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", async () => {
    await copyText(code);
    copy.textContent = "Copied";
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
  bar.append(copy);
  const pre = el("pre");
  pre.append(el("code", null, code));
  box.append(bar, pre);
  return box;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*)$/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || LIST_ITEM.test(line) || RULE.test(line) || QUOTE.test(line);
}

export function renderMarkdown(text, parent) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i++;
    } else if ((m = FENCE.exec(line))) {
      const close = new RegExp("^ {0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++; // the closing fence (or the end: a block still streaming)
      parent.append(codeBlock(m[2], body.join("\n")));
    } else if ((m = HEADING.exec(line))) {
      renderInline(m[2].replace(/\s#+\s*$/, ""), parent.appendChild(el("h" + Math.min(m[1].length + 2, 6))));
      i++;
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      for (; i < lines.length && (m = QUOTE.exec(lines[i])); i++) body.push(m[1]);
      renderMarkdown(body.join("\n"), parent.appendChild(el("blockquote")));
    } else if ((m = LIST_ITEM.exec(line))) {
      const ordered = /\d/.test(m[2]);
      const list = parent.appendChild(el(ordered ? "ol" : "ul"));
      if (ordered && parseInt(m[2], 10) !== 1) list.start = parseInt(m[2], 10);
      let item = null;
      for (; i < lines.length; i++) {
        const next = lines[i];
        const im = LIST_ITEM.exec(next);
        if (im && im[1].length <= m[1].length + 1) {
          item = list.appendChild(el("li"));
          renderInline(im[3], item);
        } else if (next.trim() && /^\s/.test(next) && item && !FENCE.test(next)) {
          item.append(document.createElement("br"));
          renderInline(next.trim(), item); // a continuation or a nested item, kept as a line of its own
        } else break;
      }
    } else {
      const p = parent.appendChild(el("p"));
      const body = [];
      for (; i < lines.length && lines[i].trim() && (body.length === 0 || !isBlockStart(lines[i])); i++) {
        body.push(lines[i]);
      }
      body.forEach((part, k) => {
        if (k) p.append(document.createElement("br"));
        renderInline(part, p);
      });
    }
  }
}
