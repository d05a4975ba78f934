// What the console's list pages (batches, models) share: the table of rows, its "nothing here" note, and the one
// notice line where a problem is shown.
const $ = (id) => document.getElementById(id);

// items: the list to draw, or null when there is none to show (a refusal, a forgotten key).
export function showRows(tableId, items, row) {
  $("empty").hidden = items === null || items.length > 0;
  $("dashboard").dataset.state = items ? "ready" : "empty";
  $(tableId).tBodies[0].replaceChildren(...(items || []).map(row));
}

export function notify(problem) {
  $("notice").hidden = !problem;
  $("notice").textContent = problem || "";
}

// One table cell of text.
export function cell(text, className) {
  const td = document.createElement("td");
  td.className = className;
  td.textContent = text;
  return td;
}
