// Shared pieces: loading/empty/error states, links, the confirmation dialog.

import type { ComponentChildren, JSX } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { messageOf } from './api/client';
import { navigate } from './router';

/** What a loaded resource is: loading, failed, or its data. */
export type Load<T> = { state: 'loading' } | { state: 'error'; error: string } | { state: 'ok'; data: T };

/** Loads `fetcher()` whenever `deps` change; `reload` runs it again keeping the data shown. */
export function useLoad<T>(fetcher: () => Promise<T>, deps: unknown[]): [Load<T>, () => void] {
  const [load, setLoad] = useState<Load<T>>({ state: 'loading' });
  const [tick, setTick] = useState(0);
  const key = JSON.stringify(deps);
  const shown = useRef<string | null>(null);
  useEffect(() => {
    let live = true;
    // A new resource starts with a spinner; a reload keeps the old data until the new arrives.
    if (shown.current !== key) {
      shown.current = key;
      setLoad({ state: 'loading' });
    }
    fetcher().then(
      (data) => live && setLoad({ state: 'ok', data }),
      (e: unknown) => live && setLoad({ state: 'error', error: messageOf(e) }),
    );
    return () => {
      live = false;
    };
  }, [key, tick]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return [load, reload];
}

/** Renders a [`Load`]: a spinner, an error with a retry button, or `children(data)`. */
export function Loaded<T>(props: { load: Load<T>; retry?: () => void; what: string; children: (data: T) => JSX.Element }) {
  const { load } = props;
  if (load.state === 'loading') return <Loading what={props.what} />;
  if (load.state === 'error') return <ErrorBox message={`Could not load ${props.what}: ${load.error}`} retry={props.retry} />;
  return props.children(load.data);
}

/** A loading state. */
export function Loading(props: { what: string }) {
  return (
    <p class="state loading" role="status" aria-live="polite">
      <span class="spinner" aria-hidden="true" /> Loading {props.what}…
    </p>
  );
}

/** An error state, with an optional retry. */
export function ErrorBox(props: { message: string; retry?: () => void }) {
  return (
    <div class="state error" role="alert">
      <span>{props.message}</span>
      {props.retry && (
        <button type="button" onClick={props.retry}>
          Retry
        </button>
      )}
    </div>
  );
}

/** An empty state. */
export function Empty(props: { children: ComponentChildren }) {
  return <p class="state empty">{props.children}</p>;
}

/** An in-app link: navigates without reloading, but stays a real link (new tab, copy). */
export function Link(props: { href: string; children: ComponentChildren; class?: string; current?: boolean }) {
  const click = (e: MouseEvent) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(props.href);
  };
  return (
    <a href={props.href} onClick={click} class={props.class} aria-current={props.current ? 'page' : undefined}>
      {props.children}
    </a>
  );
}

/** A modal confirmation (native `<dialog>`: focus trapped, Escape cancels). */
export function ConfirmDialog(props: {
  title: string;
  children: ComponentChildren;
  confirmLabel: string;
  /** A destructive action: the confirm button is red. */
  danger?: boolean;
  busy?: boolean;
  error?: string | null;
  onConfirm: () => void;
  onCancel: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
    return () => d?.open && d.close();
  }, []);
  const cancel = (e: Event) => {
    e.preventDefault();
    if (!props.busy) props.onCancel();
  };
  return (
    <dialog ref={ref} class="dialog" aria-labelledby="dialog-title" onCancel={cancel}>
      <h2 id="dialog-title">{props.title}</h2>
      <div class="dialog-body">{props.children}</div>
      {props.error && <ErrorBox message={props.error} />}
      <div class="dialog-actions">
        <button type="button" onClick={props.onCancel} disabled={props.busy}>
          Cancel
        </button>
        <button type="button" class={props.danger ? 'danger' : 'primary'} onClick={props.onConfirm} disabled={props.busy} autofocus>
          {props.busy ? 'Working…' : props.confirmLabel}
        </button>
      </div>
    </dialog>
  );
}

/** A state badge (`ready`, `failed`, ...), coloured by kind. */
export function Badge(props: { value: string }) {
  return <span class={`badge badge-${badgeKind(props.value)}`}>{props.value}</span>;
}

function badgeKind(v: string): string {
  if (['ready', 'ok', 'valid', 'validated', 'serving', 'active'].includes(v)) return 'good';
  if (['failed', 'lost', 'invalid', 'broken', 'unplaceable', 'revoked', 'expired'].includes(v)) return 'bad';
  if (['pending', 'loading', 'scheduled', 'progressing', 'uploaded', 'draining'].includes(v)) return 'busy';
  return 'plain';
}

/** The page title and an optional toolbar beside it. */
export function PageHeader(props: { title: string; children?: ComponentChildren }) {
  useEffect(() => {
    document.title = `${props.title} · Tessera`;
  }, [props.title]);
  return (
    <header class="page-header">
      <h1>{props.title}</h1>
      {props.children && <div class="toolbar">{props.children}</div>}
    </header>
  );
}

/** Copies `text` to the clipboard and says so (falls back to selecting a hidden field where
 *  the Clipboard API is missing, as on plain-http origins). */
export function CopyButton(props: { text: string; label?: string }) {
  const [copied, setCopied] = useState<'yes' | 'no' | null>(null);
  const copy = async () => {
    try {
      if (navigator.clipboard) await navigator.clipboard.writeText(props.text);
      else legacyCopy(props.text);
      setCopied('yes');
    } catch {
      setCopied('no');
    }
    setTimeout(() => setCopied(null), 2_000);
  };
  return (
    <button type="button" class="copy" onClick={copy} aria-live="polite">
      {copied === 'yes' ? 'Copied' : copied === 'no' ? 'Copy failed: select and copy by hand' : (props.label ?? 'Copy')}
    </button>
  );
}

function legacyCopy(text: string): void {
  const area = document.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.style.position = 'fixed';
  area.style.opacity = '0';
  document.body.appendChild(area);
  area.select();
  const done = document.execCommand('copy');
  area.remove();
  if (!done) throw new Error('copy refused');
}

/** A progress bar with its percentage as text. */
export function ProgressBar(props: { percent: number; label: string }) {
  return (
    <span class="progress-wrap">
      <progress max={100} value={props.percent} aria-label={props.label} /> <span data-testid="progress-text">{props.percent}%</span>
    </span>
  );
}
