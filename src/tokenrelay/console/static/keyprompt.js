// The key a console page sends as its bearer token. The page asks for it in its #key-dialog when the
// server refuses a request, and keeps it in this tab's sessionStorage only: it is gone when the tab closes,
// never written to localStorage or a cookie, and never sent anywhere but this server.

const $ = (id) => document.getElementById(id);

export async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

export class KeyPrompt {
  // storageName: the sessionStorage entry; askOn: the statuses that mean "another key is needed";
  // refusedNote: what the dialog says when the key it holds was refused.
  constructor(storageName, { askOn = [401], refusedNote = "That key was not accepted.", onForget = null } = {}) {
    this.storageName = storageName;
    this.askOn = askOn;
    this.refusedNote = refusedNote;
    $("forget-key").addEventListener("click", () => {
      this.forget();
      onForget?.();
    });
    this.showState();
  }

  get key() {
    return sessionStorage.getItem(this.storageName);
  }

  forget() {
    sessionStorage.removeItem(this.storageName);
    this.showState();
  }

  showState() {
    $("key-state").hidden = !this.key;
  }

  // fetch() with the key; on a refusal, asks for a key and retries until one is accepted or the user
  // cancels (then the refusal is returned, and a key known to be refused is not kept).
  async fetch(path, init = {}) {
    for (;;) {
      const sent = this.key;
      const headers = { ...(init.headers || {}), ...(sent ? { Authorization: `Bearer ${sent}` } : {}) };
      const response = await fetch(path, { ...init, headers });
      if (!this.askOn.includes(response.status)) return response;
      if (this.key !== sent) continue; // another request of this page got a new key meanwhile
      if (!(await this.ask(sent ? this.refusedNote : ""))) {
        if (sent && this.key === sent) this.forget();
        return response;
      }
    }
  }

  ask(note) {
    // Requests refused at the same moment share one dialog.
    this.asking ??= this.#dialog(note).finally(() => (this.asking = null));
    return this.asking;
  }

  #dialog(note) {
    const dialog = $("key-dialog");
    const input = $("key-input");
    $("key-note").textContent = note;
    input.value = "";
    dialog.returnValue = ""; // an Escape keeps the previous value otherwise
    return new Promise((resolve) => {
      dialog.addEventListener(
        "close",
        () => {
          const key = input.value.trim();
          if (dialog.returnValue !== "ok" || !key) return resolve(false);
          sessionStorage.setItem(this.storageName, key);
          this.showState();
          resolve(true);
        },
        { once: true },
      );
      dialog.showModal();
      input.focus();
    });
  }
}
