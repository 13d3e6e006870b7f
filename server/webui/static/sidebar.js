// The conversation list: pick, rename (in place) and delete.

function button(cls, text, title, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.textContent = text;
  b.title = title;
  b.addEventListener("click", (ev) => {
    ev.stopPropagation();
    onClick();
  });
  return b;
}

function renameInPlace(li, conv, convs, redraw) {
  const input = document.createElement("input");
  input.className = "rename-input";
  input.value = conv.title;
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep) convs.rename(conv.id, input.value);
    redraw();
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") finish(true);
    else if (ev.key === "Escape") {
      ev.stopPropagation();     // not the page's "stop the answer"
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
  li.querySelector(".title").replaceWith(input);
  input.focus();
  input.select();
}

// Draw `convs` into the list element; `onPick()` after the current one changes.
export function drawList(list, convs, onPick) {
  const redraw = () => drawList(list, convs, onPick);
  list.replaceChildren(...convs.list.map((conv) => {
    const li = document.createElement("li");
    li.className = "conv" + (conv.id === convs.currentId ? " current" : "");
    li.dataset.id = conv.id;
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = conv.title;
    li.append(title,
      button("rename", "✎", "Rename", () => renameInPlace(li, conv, convs, redraw)),
      button("delete", "✕", "Delete", () => {
        convs.remove(conv.id);
        redraw();
        onPick();
      }));
    li.addEventListener("click", () => {
      if (conv.id === convs.currentId) return;
      convs.select(conv.id);
      redraw();
      onPick();
    });
    return li;
  }));
}
