// farm-label's page: shows this annotator's current pair, sends one answer at a time (a label, a
// skip or a flag, with a comment) and moves on only when the server says the answer is written. An
// answer the server could not save (its disk is full, or it cannot be reached) stays chosen on the
// page, and Retry sends it again. Model outputs are untrusted: the instruction and input are set with
// textContent; the outputs and guidelines only as the HTML the server rendered from their markdown
// with raw HTML off (the *_html fields), never from a raw text.
"use strict";

(() => {
  // the page is served at /a/<token>; its API lives under the same path, so the token never leaves it
  const base = window.location.pathname.replace(/\/+$/, "");
  const byId = (id) => document.getElementById(id);
  const labelButtons = Array.from(document.querySelectorAll("#choices button[data-choice]"));
  // skip for now, can't judge, report a problem: no label
  const otherButtons = Array.from(document.querySelectorAll("#other button[data-choice]"));
  const choiceButtons = [...labelButtons, ...otherButtons];
  // keys 1-5 are the label buttons in their order on the page; s, c and p the others
  const keyChoices = new Map([
    ...labelButtons.map((button, index) => [String(index + 1), button]),
    ...otherButtons.map((button) => [button.getAttribute("aria-keyshortcuts"), button]),
  ]);
  const commentBox = byId("comment");
  const undoButton = byId("undo");
  const retryButton = byId("retry");
  // replies after which nothing was saved and the same request may be sent again: the server could
  // not write it (507), or a reverse proxy in front could not reach the server (502, 503, 504)
  const RETRYABLE = new Set([502, 503, 504, 507]);

  let state = null;
  let shownItem = null;
  let shownSkipped = false;
  let shownAt = 0;
  let inFlight = false;
  // the request the server did not save ({method, path, body, conflictMessage}), sent again by Retry
  let unsaved = null;

  function setText(element, text) {
    element.textContent = text;
  }

  // only ever the server's rendering of markdown (raw HTML escaped, links http(s) only)
  function setRendered(element, html) {
    element.innerHTML = typeof html === "string" ? html : "";
  }

  function showError(message) {
    setText(byId("error"), message);
    byId("error").hidden = !message;
  }

  function refreshButtons() {
    for (const button of choiceButtons) {
      button.disabled = inFlight || !state || !state.item;
      // the choice that is not saved yet stays marked until it is, or another is made
      const chosen =
        unsaved !== null && unsaved.path === "answer" && unsaved.body.choice === button.dataset.choice;
      button.classList.toggle("unsaved", chosen);
    }
    undoButton.disabled = inFlight || !state || !state.can_undo;
    retryButton.hidden = unsaved === null;
    retryButton.disabled = inFlight;
  }

  function render(next) {
    state = next;
    setText(byId("annotator"), next.annotator);
    const skipped = next.progress.skipped ? ` (${next.progress.skipped} skipped)` : "";
    setText(byId("progress"), `${next.progress.done} / ${next.progress.total}${skipped}`);
    setRendered(byId("guidelines").querySelector(".markdown"), next.guidelines_html);
    const item = next.item;
    byId("task").hidden = item === null;
    byId("done").hidden = item !== null;
    if (item !== null) {
      setText(byId("instruction"), item.instruction);
      const hasInput = Boolean(item.input);
      setText(byId("input"), hasInput ? item.input : "");
      byId("input").hidden = !hasInput;
      byId("input-heading").hidden = !hasInput;
      setRendered(byId("left").querySelector(".markdown"), item.left_html);
      setRendered(byId("right").querySelector(".markdown"), item.right_html);
      byId("skipped-before").hidden = !item.skipped_before;
      if (item.item_id !== shownItem || item.skipped_before !== shownSkipped) {
        // a new pair on screen (or one skipped, back): its time starts now, the reader starts at
        // its top, and the comment box is empty
        shownItem = item.item_id;
        shownSkipped = item.skipped_before;
        shownAt = performance.now();
        commentBox.value = "";
        window.scrollTo(0, 0);
      }
    } else {
      shownItem = null;
    }
    refreshButtons();
  }

  async function request(method, path, body) {
    const options = { method, cache: "no-store", headers: {} };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(`${base}/api/${path}`, options);
    let payload = null;
    try {
      payload = await response.json();
    } catch (_) {
      payload = null;
    }
    return { response, payload };
  }

  // One request at a time: the buttons and keys stay dead until the server has answered, so a
  // double click or a held key cannot send a second answer for the same pair.
  async function send(method, path, body, conflictMessage) {
    if (inFlight) {
      return;
    }
    inFlight = true;
    refreshButtons();
    const what = path === "answer" ? "Your answer" : "Your undo";
    const kept = path === "answer" ? "Your choice is kept on this page: press Retry (R)" : "Press Retry (R)";
    try {
      const { response, payload } = await request(method, path, body);
      if (RETRYABLE.has(response.status)) {
        // not saved, nothing of it kept: the same request may be sent again as it is
        unsaved = { method, path, body, conflictMessage };
        const reason =
          payload && typeof payload.error === "string" ? payload.error : `HTTP ${response.status}`;
        const why = response.status === 507 ? "the server's disk may be full" : "the server may be down";
        showError(
          `${what} was NOT saved (the server says: ${reason}). ${kept} to send it again. If it fails ` +
            `again, tell the organiser: ${why}.`,
        );
        return;
      }
      unsaved = null;
      if (response.ok && payload) {
        showError("");
        render(payload);
      } else if (response.status === 409) {
        if (payload && payload.state) {
          render(payload.state);
        }
        showError(conflictMessage);
      } else {
        showError(
          `The server refused this (HTTP ${response.status}); nothing was saved. Reload the page; ` +
            "if it happens again, tell the organiser.",
        );
      }
    } catch (_) {
      unsaved = { method, path, body, conflictMessage };
      showError(
        `The server cannot be reached: ${what.toLowerCase()} was NOT saved. When it is running again, ` +
          `${kept.charAt(0).toLowerCase()}${kept.slice(1)} to send it again, or reload the page to ` +
          "continue where you were.",
      );
    } finally {
      inFlight = false;
      refreshButtons();
    }
  }

  function retry() {
    if (unsaved !== null) {
      send(unsaved.method, unsaved.path, unsaved.body, unsaved.conflictMessage);
    }
  }

  function answer(choice) {
    if (!state || !state.item || inFlight) {
      return;
    }
    const comment = commentBox.value.trim();
    if (choice === "problem" && !comment) {
      showError("Say in the comment box what the problem is, then press Report a problem again.");
      commentBox.focus();
      return;
    }
    const seconds = (performance.now() - shownAt) / 1000;
    // the focused button would otherwise take a stray Enter or Space as an answer to the next pair
    if (document.activeElement instanceof HTMLElement) {
      document.activeElement.blur();
    }
    send(
      "POST",
      "answer",
      { item_id: state.item.item_id, choice, seconds, comment },
      "That pair was already answered (another tab?); this is your current one.",
    );
  }

  function undo() {
    if (!state || !state.can_undo) {
      return;
    }
    send("POST", "undo", {}, "There is nothing to undo.");
  }

  for (const button of choiceButtons) {
    button.addEventListener("click", () => answer(button.dataset.choice));
  }
  undoButton.addEventListener("click", undo);
  retryButton.addEventListener("click", retry);

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) {
      return;
    }
    if (event.target === commentBox) {
      // typing a comment: keys are text; Escape leaves the box for the keys to choose again
      if (event.key === "Escape") {
        commentBox.blur();
      }
      return;
    }
    if (keyChoices.has(event.key.toLowerCase())) {
      event.preventDefault();
      answer(keyChoices.get(event.key.toLowerCase()).dataset.choice);
    } else if (event.key === "u" || event.key === "U") {
      event.preventDefault();
      undo();
    } else if ((event.key === "r" || event.key === "R") && unsaved !== null) {
      event.preventDefault();
      retry();
    }
  });

  async function load() {
    try {
      const { response, payload } = await request("GET", "state");
      if (!response.ok || !payload) {
        showError(`The server refused this page (HTTP ${response.status}). Check your link.`);
        return;
      }
      render(payload);
    } catch (_) {
      showError("The server cannot be reached. When it is running again, reload the page.");
    }
  }

  load();
})();
