// memstream dashboard: draws a reflection's evidence graph from /memory/ID/evidence.json.
// Memory text is untrusted: it only ever reaches the page through textContent, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) {
    element.setAttribute(key, String(value));
  }
  return element;
}

function shorten(text, width) {
  const flat = text.split(/\s+/).join(" ").trim();
  return flat.length <= width ? flat : flat.slice(0, width - 1) + "\u2026";
}

// The tree as a graph: one node per memory (evidence shared by two insights is drawn once), an edge from
// each reflection to what it cites. An observation sits on the bottom row; a reflection of depth d, d rows up.
function flatten(tree) {
  const nodes = new Map();
  const edges = [];
  const seenEdges = new Set();
  (function visit(node) {
    if (!nodes.has(node.id)) {
      nodes.set(node.id, node);
    }
    for (const child of node.evidence) {
      const key = node.id + ">" + child.id;
      if (!seenEdges.has(key)) {
        seenEdges.add(key);
        edges.push([node.id, child.id]);
      }
      visit(child);
    }
  })(tree);
  return { nodes: [...nodes.values()], edges };
}

function layout(nodes) {
  const rows = new Map();
  for (const node of nodes) {
    const level = node.kind === "reflection" ? Math.max(1, node.depth) : 0;
    if (!rows.has(level)) {
      rows.set(level, []);
    }
    rows.get(level).push(node);
  }
  const levels = [...rows.keys()].sort((a, b) => b - a);  // the deepest row on top
  const width = 190;
  const gap = 24;
  const rowHeight = 96;
  const widest = Math.max(...levels.map((level) => rows.get(level).length));
  const total = widest * (width + gap) + gap;
  const place = new Map();
  levels.forEach((level, row) => {
    const members = rows.get(level);
    const used = members.length * (width + gap) - gap;
    members.forEach((node, i) => {
      place.set(node.id, { x: (total - used) / 2 + i * (width + gap), y: 16 + row * rowHeight });
    });
  });
  return { place, width, height: 44, total, depth: levels.length * rowHeight };
}

function draw(container, tree) {
  const { nodes, edges } = flatten(tree);
  const box = layout(nodes);
  const svg = svgElement("svg", {
    class: "evidence", viewBox: `0 0 ${box.total} ${box.depth}`, width: box.total, height: box.depth,
    role: "img", "aria-label": `evidence graph of memory #${tree.id}`,
  });
  for (const [from, to] of edges) {
    const a = box.place.get(from);
    const b = box.place.get(to);
    svg.appendChild(svgElement("line", {
      class: "edge", x1: a.x + box.width / 2, y1: a.y + box.height, x2: b.x + box.width / 2, y2: b.y,
    }));
  }
  for (const node of nodes) {
    const at = box.place.get(node.id);
    const link = svgElement("a", { href: `/memory/${node.id}`, class: `node ${node.kind}`, "data-id": node.id });
    const title = svgElement("title", {});
    title.textContent = `#${node.id} ${node.kind} (importance ${node.importance}): ${node.text}`;
    link.appendChild(title);
    const importance = node.importance === null ? "pending" : `imp${node.importance}`;
    link.appendChild(svgElement("rect", {
      class: `box ${node.kind === "reflection" ? "reflection" : importance}`, x: at.x, y: at.y,
      width: box.width, height: box.height, rx: 6,
    }));
    const head = svgElement("text", { class: "head", x: at.x + 8, y: at.y + 16 });
    head.textContent = `#${node.id} ${node.kind === "reflection" ? "reflection, depth " + node.depth
      : "observation"} \u00b7 ${node.importance === null ? "pending" : node.importance}`;
    const body = svgElement("text", { class: "body", x: at.x + 8, y: at.y + 33 });
    body.textContent = shorten(node.text, 30);
    link.appendChild(head);
    link.appendChild(body);
    svg.appendChild(link);
  }
  container.replaceChildren(svg);
  container.dataset.drawn = String(nodes.length);
}

async function drawGraph(container) {
  const response = await fetch(container.dataset.src, { credentials: "same-origin" });
  if (!response.ok) {
    container.textContent = `The evidence could not be loaded (HTTP ${response.status}).`;
    return;
  }
  draw(container, await response.json());
}

document.addEventListener("DOMContentLoaded", () => {
  const container = document.getElementById("graph");
  if (container !== null) {
    drawGraph(container).catch((error) => {
      container.textContent = `The evidence graph failed: ${error}`;
    });
  }
});
