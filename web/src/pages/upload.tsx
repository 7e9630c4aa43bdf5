// Uploading a model version from the console: a file (streamed from disk, never read whole),
// its packaging, an optional Triton config, and a progress bar while the bytes go up.

import { useRef, useState } from 'preact/hooks';
import { messageOf } from '../api/client';
import type { components } from '../api/schema';
import { uploadVersion, type Upload } from '../api/upload';
import { formatBytes } from '../format';
import { formatOfFile, parseConfig, uploadPercent } from '../forms';
import { ErrorBox, ProgressBar } from '../ui';

type Version = components['schemas']['ModelVersion'];
type Format = components['schemas']['ArtifactFormat'];

/** The upload form of a model page (deployers). */
export function UploadVersion(props: { tenant: string; model: string; onUploaded: (v: Version) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [format, setFormat] = useState<Format>('onnx');
  const [config, setConfig] = useState('');
  const [percent, setPercent] = useState<number | null>(null);
  const [error, setError] = useState<string | null>(null);
  const running = useRef<Upload | null>(null);
  const choose = (e: Event) => {
    const f = (e.target as HTMLInputElement).files?.[0] ?? null;
    setFile(f);
    setError(null);
    if (f) setFormat(formatOfFile(f.name));
  };
  const submit = async (e: Event) => {
    e.preventDefault();
    if (!file) return setError('File: choose the model file (.onnx, or a .tar/.zip model directory).');
    const cfg = parseConfig(config);
    if (!cfg.ok) return setError(cfg.error);
    setError(null);
    setPercent(0);
    const upload = uploadVersion({ tenant: props.tenant, model: props.model, file, format, config: cfg.value }, (loaded, total) =>
      setPercent(uploadPercent(loaded, total)),
    );
    running.current = upload;
    try {
      const v = await upload.done;
      setPercent(100);
      props.onUploaded(v);
      setFile(null);
      (e.target as HTMLFormElement).reset();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      running.current = null;
      setPercent(null);
    }
  };
  const busy = percent !== null;
  return (
    <form class="form-card" onSubmit={submit} aria-label="Upload a version" data-testid="upload">
      <h2>Upload a version</h2>
      <div class="form-row">
        <label>
          Model file <input type="file" name="artifact" accept=".onnx,.tar,.zip" onChange={choose} disabled={busy} />
        </label>
        <label>
          Packaging{' '}
          <select name="format" value={format} onChange={(e) => setFormat((e.target as HTMLSelectElement).value as Format)} disabled={busy}>
            <option value="onnx">ONNX file</option>
            <option value="tar">tar of a model directory</option>
            <option value="zip">zip of a model directory</option>
          </select>
        </label>
        {file && <span class="muted">{formatBytes(file.size)}</span>}
      </div>
      <label class="block">
        Model config (Triton's, as JSON; blank: the model's own)
        <textarea name="config" rows={3} placeholder='{"max_batch_size": 8}' value={config} disabled={busy} onInput={(e) => setConfig((e.target as HTMLTextAreaElement).value)} />
      </label>
      <div class="toolbar inline">
        <button type="submit" class="primary" disabled={busy || !file}>
          {busy ? 'Uploading…' : 'Upload'}
        </button>
        {busy && (
          <>
            <ProgressBar percent={percent ?? 0} label={`Uploading ${file?.name ?? ''}`} />
            {percent === 100 && <span class="muted">sent; the control plane checks the model…</span>}
            <button type="button" onClick={() => running.current?.abort()}>
              Cancel upload
            </button>
          </>
        )}
      </div>
      {error && <ErrorBox message={`Upload refused: ${error}`} />}
    </form>
  );
}
