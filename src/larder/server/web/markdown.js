// markdown.js — a small Markdown renderer for model answers. It builds DOM nodes and sets only
// textContent, never innerHTML: whatever the model writes (<script>, <img onerror=...>, HTML
// entities) is shown as the characters it is. Covers what chat answers use: fenced code blocks
// (also while still open during streaming), inline code, headings, lists, block quotes, rules,
// **bold**, *italic*, and [links](https://...) whose target is http(s) only.
"use strict";
(function () {
  function el(tag, text) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Underscores emphasize only at word boundaries (snake_case and __dunder__ names stay as written).
  const INLINE = /(\*\*([^*\n]+?)\*\*)|((?<!\w)__([^_\n]+?)__(?!\w))|(\*([^*\s][^*\n]*?)\*)|(\[([^\]\n]+)\]\(([^)\s]+)\))/;

  // Emphasis and links in text that holds no code span.
  function inlinePlain(text, parent) {
    while (text.length) {
      const m = INLINE.exec(text);
      if (!m) break;
      if (m.index > 0) parent.appendChild(document.createTextNode(text.slice(0, m.index)));
      if (m[1]) inlinePlain(m[2], parent.appendChild(el("strong")));
      else if (m[3]) inlinePlain(m[4], parent.appendChild(el("strong")));
      else if (m[5]) inlinePlain(m[6], parent.appendChild(el("em")));
      else if (/^https?:\/\//i.test(m[9])) {
        const a = el("a");
        a.href = m[9];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        inlinePlain(m[8], a);
        parent.appendChild(a);
      } else {
        parent.appendChild(document.createTextNode(m[0]));  // javascript:, data:, relative: as text
      }
      text = text.slice(m.index + m[0].length);
    }
    if (text.length) parent.appendChild(document.createTextNode(text));
  }

  // Code spans first (their content is literal), then emphasis in the rest.
  function inline(text, parent) {
    const re = /(`+)([\s\S]*?[^`])\1(?!`)/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      inlinePlain(text.slice(last, m.index), parent);
      parent.appendChild(el("code", m[2].replace(/^ (.*) $/, "$1")));
      last = m.index + m[0].length;
    }
    inlinePlain(text.slice(last), parent);
    return parent;
  }

  function render(src) {
    const out = document.createDocumentFragment();
    const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
    let para = null;
    const endPara = () => {
      if (para) out.appendChild(inline(para.join("\n"), el("p")));
      para = null;
    };
    for (let i = 0; i < lines.length; ) {
      const line = lines[i];
      let m;
      if ((m = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/.exec(line))) {
        endPara();
        const fence = m[1], body = [];
        for (i++; i < lines.length; i++) {
          const close = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(lines[i]);
          if (close && close[1][0] === fence[0] && close[1].length >= fence.length) { i++; break; }
          body.push(lines[i]);
        }
        const pre = el("pre"), code = el("code", body.join("\n"));
        const lang = m[2].replace(/[^\w+#.-]/g, "");
        if (lang) {
          code.className = "language-" + lang;
          code.dataset.lang = lang;
        }
        pre.appendChild(code);
        out.appendChild(pre);
        continue;
      }
      if (/^\s*$/.test(line)) { endPara(); i++; continue; }
      if ((m = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
        endPara();
        out.appendChild(inline(m[2], el("h" + m[1].length)));
        i++;
        continue;
      }
      if (/^ {0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) { endPara(); out.appendChild(el("hr")); i++; continue; }
      if (/^ {0,3}>/.test(line)) {
        endPara();
        const body = [];
        for (; i < lines.length && /^ {0,3}>/.test(lines[i]); i++) body.push(lines[i].replace(/^ {0,3}> ?/, ""));
        const q = el("blockquote");
        q.appendChild(render(body.join("\n")));
        out.appendChild(q);
        continue;
      }
      const ul = /^\s{0,3}[-*+]\s+(.*)$/, ol = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
      if (ul.test(line) || ol.test(line)) {
        endPara();
        const ordered = !ul.test(line), re = ordered ? ol : ul;
        const list = el(ordered ? "ol" : "ul");
        if (ordered && ol.exec(line)[1] !== "1") list.start = Number(ol.exec(line)[1]);
        let item = null;
        for (; i < lines.length; i++) {
          const lm = re.exec(lines[i]);
          if (lm) {
            item = inline(ordered ? lm[2] : lm[1], el("li"));
            list.appendChild(item);
          } else if (item && /^\s{2,}\S/.test(lines[i])) {
            item.appendChild(document.createTextNode("\n"));
            inline(lines[i].trim(), item);
          } else {
            break;
          }
        }
        out.appendChild(list);
        continue;
      }
      (para = para || []).push(line);
      i++;
    }
    endPara();
    return out;
  }

  window.larderMarkdown = { render: render };
})();
