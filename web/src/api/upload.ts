// Uploading a model version with progress. `POST .../versions` takes the artifact as the raw
// request body, streamed to the object store; XMLHttpRequest sends a `File` straight from disk
// (never read whole into memory) and, unlike fetch, reports upload progress.

import type { components } from './schema';
import { ApiError, apiError, bearer, csrfToken } from './client';

type Version = components['schemas']['ModelVersion'];

/** What to upload and where. */
export interface UploadRequest {
  tenant: string;
  model: string;
  file: Blob;
  format: components['schemas']['ArtifactFormat'];
  /** Triton model configuration as JSON, or null for the model's own. */
  config: Record<string, unknown> | null;
}

/** A running upload: its result, and how to stop it. */
export interface Upload {
  done: Promise<Version>;
  abort: () => void;
}

/** Starts the upload; `progress(loaded, total)` is called as bytes leave. */
export function uploadVersion(req: UploadRequest, progress: (loaded: number, total: number) => void): Upload {
  const xhr = new XMLHttpRequest();
  const path = `/v1/tenants/${encodeURIComponent(req.tenant)}/models/${encodeURIComponent(req.model)}/versions?format=${req.format}`;
  xhr.open('POST', path);
  const token = bearer();
  if (token) xhr.setRequestHeader('Authorization', `Bearer ${token}`);
  const csrf = csrfToken();
  if (csrf) xhr.setRequestHeader('X-CSRF-Token', csrf);
  xhr.setRequestHeader('Content-Type', 'application/octet-stream');
  if (req.config) xhr.setRequestHeader('X-Model-Config', JSON.stringify(req.config));
  // Retrying after a dropped connection must not create a second version.
  xhr.setRequestHeader('Idempotency-Key', randomKey());
  xhr.responseType = 'text';
  xhr.upload.onprogress = (e) => progress(e.loaded, e.lengthComputable ? e.total : req.file.size);
  const done = new Promise<Version>((resolve, reject) => {
    xhr.onload = () => {
      const body = parseJson(xhr.responseText);
      if (xhr.status >= 200 && xhr.status < 300 && body !== undefined) resolve(body as Version);
      else reject(apiError(xhr.status, xhr.statusText, body));
    };
    xhr.onerror = () => reject(new ApiError(0, 'network', 'The upload was cut off: the control plane did not answer.'));
    xhr.onabort = () => reject(new ApiError(0, 'aborted', 'Upload cancelled.'));
  });
  xhr.send(req.file);
  return { done, abort: () => xhr.abort() };
}

/** 128 random bits as hex (`crypto.randomUUID` exists only in secure contexts, and the
 *  console may be served over plain http inside a private network). */
function randomKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

function parseJson(text: string): unknown {
  try {
    return text ? JSON.parse(text) : undefined;
  } catch {
    return undefined;
  }
}
