"use strict";
// What a socket received, in order, and a way to wait for the item one wants.

class Inbox {
  constructor() {
    this.items = [];
    this.waiters = new Set();
  }

  push(item) {
    this.items.push(item);
    for (const wake of this.waiters) wake();
  }

  /** The first item from index `from` that `want` accepts, or null after timeoutMs. */
  async next(want, timeoutMs, from = 0) {
    const deadline = Date.now() + timeoutMs;
    for (let index = from; ; ) {
      for (; index < this.items.length; index++) {
        if (want(this.items[index])) return this.items[index];
      }
      const left = deadline - Date.now();
      if (left <= 0) return null;
      await new Promise((resolve) => {
        const wake = () => {
          this.waiters.delete(wake);
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(wake, left);
        this.waiters.add(wake);
      });
    }
  }
}

module.exports = { Inbox };
