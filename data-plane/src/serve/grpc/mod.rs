//! The KServe v2 gRPC endpoint: `inference.GRPCInferenceService` and `grpc.health.v1.Health`.

// `pub(crate)` for `crate::fuzzing`, which hands the request conversion to the fuzz targets.
pub(crate) mod convert;
mod logging;
pub mod serve;
pub(crate) mod socket;
mod trace;

use std::pin::Pin;
use std::sync::Arc;

use futures::stream::{FuturesOrdered, StreamExt};
use prost::Message as _;
use tessera_protocol::health::health_check_response::ServingStatus;
use tessera_protocol::health::health_server::{Health, HealthServer};
use tessera_protocol::health::{HealthCheckRequest, HealthCheckResponse};
use tessera_protocol::inference::cuda_shared_memory_status_response::RegionStatus as CudaRegionStatus;
use tessera_protocol::inference::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use tessera_protocol::inference::model_metadata_response::TensorMetadata;
use tessera_protocol::inference::model_repository_parameter::ParameterChoice as RepoParam;
use tessera_protocol::inference::repository_index_response::ModelIndex;
use tessera_protocol::inference::system_shared_memory_status_response::RegionStatus;
use tessera_protocol::inference::*;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Principal, Role};
use crate::engine::cuda_ipc::{HANDLE_BYTES, IpcHandle};
use crate::error::Error;
use crate::serve::facade::{Answered, batch_rows};
use crate::serve::net::tls::TlsAcceptor;
use crate::serve::server::ServerState;
use crate::serve::shared_memory::{Kind, tensors};
use crate::spans::Origin;
use crate::trace::Event;

type GrpcResult<T> = Result<Response<T>, Status>;

/// Serves gRPC on `listener` until `shutdown`, over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ServerState>,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
) {
    serve::serve(listener, routes(state), shutdown, tls).await;
}

/// The endpoint's services: inference and health.
fn routes(state: Arc<ServerState>) -> Routes {
    let limit = state.max_input_size;
    // Compressed requests are accepted as Triton accepts them. Responses stay uncompressed:
    // tonic compresses one only when `send_compressed` is set, and like Triton's default we do not.
    let inference = GrpcInferenceServiceServer::new(InferenceService { state: state.clone() })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(i32::MAX as usize)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    let health = HealthServer::new(HealthService { state })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    Routes::new(inference).add_service(health)
}

/// Parses a gRPC version string ("" means the policy's latest).
fn version(model: &str, v: &str) -> Result<Option<i64>, Status> {
    crate::engine::manager::parse_version(model, Some(v)).map_err(Status::from)
}

struct InferenceService {
    state: Arc<ServerState>,
}

impl InferenceService {
    /// One inference through the request facade (metered on workers once the model resolved in
    /// the caller's tenant, before the response is handed back).
    /// `traceparent` reads the call's (or its stream's) `traceparent` metadata, only when the
    /// request may be traced or its log span is on.
    async fn infer<'t>(
        state: &ServerState,
        caller: Option<&Principal>,
        req: ModelInferRequest,
        traceparent: &'t (dyn Fn() -> Option<&'t str> + Sync),
    ) -> Result<ModelInferResponse, Error> {
        let v = crate::engine::manager::parse_version(&req.model_name, Some(&req.model_version))?;
        let model = req.model_name.clone();
        let metered = state.usage().is_some();
        let bytes_in = if metered { req.encoded_len() as u64 } else { 0 };
        let origin = Origin { protocol: "grpc", traceparent };
        state
            .infer(
                origin,
                caller,
                &model,
                v,
                || bytes_in,
                async |loaded, tap| {
                    // Tonic has read the message by now: the receive steps are its decode, the
                    // send steps the response's encode.
                    let trace = state.start_trace(caller, &model, loaded, traceparent);
                    trace.stamp(Event::GrpcWaitreadStart);
                    let (mut request, shm_inputs) = convert::infer_request(req)?;
                    let shm = tensors::resolve(state.shared_memory(), caller, &mut request, shm_inputs).await?;
                    let rows = batch_rows(&loaded.spec, &request);
                    crate::spans::name_request(&request.id);
                    trace.stamp(Event::GrpcWaitreadEnd);
                    tap.request(&request);
                    let mut response = loaded.infer_traced(request, trace.clone()).await?;
                    tap.response(&response);
                    if let Some(shm) = &shm {
                        shm.write(&mut response).await?;
                    }
                    trace.stamp(Event::GrpcSendStart);
                    let answer = convert::infer_response(response, shm.as_ref());
                    let bytes_out = if metered { answer.encoded_len() as u64 } else { 0 };
                    trace.stamp(Event::GrpcSendEnd);
                    Ok(Answered { answer, rows, bytes_out })
                },
            )
            .await
    }

    /// The caller, from the `authorization` metadata, when the server requires authentication.
    async fn caller<T>(&self, req: &Request<T>, needed: Role) -> Result<Option<Principal>, Status> {
        let header = |name: &'static str| req.metadata().get(name).and_then(|v| v.to_str().ok());
        Ok(self.state.authorize(header, needed).await?)
    }
}

/// Requests of one stream running at once; past it, the stream is not read until one answers
/// (backpressure instead of unbounded memory for a client that sends faster than it reads).
const STREAM_IN_FLIGHT: usize = 64;

type StreamOut = Pin<Box<dyn futures::Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> GrpcResult<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse { live: self.state.is_live() }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> GrpcResult<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse { ready: self.state.is_ready() }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> GrpcResult<ModelReadyResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let req = req.into_inner();
        let v = version(&req.name, &req.version)?;
        // Like Triton, an unknown model or version is simply not ready.
        let ready = self.state.model(caller.as_ref(), &req.name, v).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, req: Request<ServerMetadataRequest>) -> GrpcResult<ServerMetadataResponse> {
        self.caller(&req, Role::Inference).await?;
        Ok(Response::new(ServerMetadataResponse {
            name: self.state.name.to_string(),
            version: self.state.version.to_string(),
            extensions: self.state.extensions().iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn model_metadata(&self, req: Request<ModelMetadataRequest>) -> GrpcResult<ModelMetadataResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let req = req.into_inner();
        let v = version(&req.name, &req.version)?;
        let loaded = self.state.model(caller.as_ref(), &req.name, v)?;
        let versions = match v {
            Some(v) => vec![v.to_string()],
            None => {
                self.state.ready_versions(caller.as_ref(), &req.name)?.iter().map(|m| m.version.to_string()).collect()
            }
        };
        let spec = &loaded.spec;
        let tensors = |list: &[crate::engine::model_spec::TensorSpec]| {
            list.iter()
                .map(|t| TensorMetadata {
                    name: t.name.clone(),
                    datatype: t.datatype.as_wire().to_string(),
                    shape: spec.full_shape(&t.dims),
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: spec.name.clone(),
            versions,
            platform: spec.platform().to_string(),
            inputs: tensors(&spec.inputs),
            outputs: tensors(&spec.outputs),
        }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> GrpcResult<ModelInferResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let (metadata, _, req) = req.into_parts();
        let traceparent = || metadata.get("traceparent")?.to_str().ok();
        Ok(Response::new(Self::infer(&self.state, caller.as_ref(), req, &traceparent).await?))
    }

    type ModelStreamInferStream = StreamOut;

    /// Non-decoupled streaming: requests run concurrently, responses leave in request order,
    /// errors travel in-band in `error_message` and the stream stays open (Triton's default);
    /// a message that cannot be read ends it with a status (see [`run_stream`]).
    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> GrpcResult<Self::ModelStreamInferStream> {
        // One check per stream: the credential is in the stream's metadata, not its messages.
        let caller = self.caller(&req, Role::Inference).await?.map(Arc::new);
        // The stream's metadata is its every request's: kept for their traces and log spans.
        let traceparent: Option<Arc<str>> =
            req.metadata().get("traceparent").and_then(|v| v.to_str().ok()).map(Arc::from);
        let (state, incoming) = (self.state.clone(), req.into_inner());
        let stream = Stream { state, caller, traceparent };
        Ok(Response::new(async_stream_ordered(move |tx| run_stream(stream, incoming, tx))))
    }

    async fn model_config(&self, req: Request<ModelConfigRequest>) -> GrpcResult<ModelConfigResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let req = req.into_inner();
        let v = version(&req.name, &req.version)?;
        let loaded = self.state.model(caller.as_ref(), &req.name, v)?;
        Ok(Response::new(ModelConfigResponse { config: Some(loaded.spec.config.clone()) }))
    }

    async fn model_statistics(&self, req: Request<ModelStatisticsRequest>) -> GrpcResult<ModelStatisticsResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let req = req.into_inner();
        let model_stats = if req.name.is_empty() {
            self.state.statistics(caller.as_ref(), None, None)?
        } else {
            let v = version(&req.name, &req.version)?;
            self.state.statistics(caller.as_ref(), Some(&req.name), v)?
        };
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(&self, req: Request<RepositoryIndexRequest>) -> GrpcResult<RepositoryIndexResponse> {
        self.state.check_model_control()?;
        let models = self
            .state
            .manager
            .index(req.into_inner().ready)
            .into_iter()
            .map(|r| ModelIndex {
                name: r.name,
                version: r.version.map(|v| v.to_string()).unwrap_or_default(),
                state: r.state.map(|s| s.as_str().to_string()).unwrap_or_default(),
                reason: r.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> GrpcResult<RepositoryModelLoadResponse> {
        self.state.check_model_control()?;
        let req = req.into_inner();
        let pairs = req.parameters.iter().map(|(k, p)| {
            let text = match &p.parameter_choice {
                Some(RepoParam::StringParam(s)) => Some(s.clone()),
                Some(RepoParam::BytesParam(b)) => String::from_utf8(b.clone()).ok(),
                _ => None,
            };
            (k.as_str(), text)
        });
        let config = crate::serve::server::load_config_override(pairs)?;
        self.state.manager.load(&req.model_name, config).await?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> GrpcResult<RepositoryModelUnloadResponse> {
        self.state.check_model_control()?;
        self.state.manager.unload(&req.into_inner().model_name).await?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> GrpcResult<SystemSharedMemoryStatusResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let name = req.into_inner().name;
        let regions = self.state.shared_memory().status(caller.as_ref(), (!name.is_empty()).then_some(&*name))?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status =
                    RegionStatus { name: r.name.clone(), key: r.key, offset: r.offset, byte_size: r.byte_size };
                (r.name, status)
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> GrpcResult<SystemSharedMemoryRegisterResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let r = req.into_inner();
        self.state.shared_memory().register(caller.as_ref(), &r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> GrpcResult<SystemSharedMemoryUnregisterResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let name = req.into_inner().name;
        self.state.shared_memory().unregister(caller.as_ref(), Kind::System, (!name.is_empty()).then_some(&*name))?;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        req: Request<CudaSharedMemoryStatusRequest>,
    ) -> GrpcResult<CudaSharedMemoryStatusResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let name = req.into_inner().name;
        let regions = self.state.shared_memory().cuda_status(caller.as_ref(), (!name.is_empty()).then_some(&*name))?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status = CudaRegionStatus { name: r.name.clone(), device_id: r.device_id, byte_size: r.byte_size };
                (r.name, status)
            })
            .collect();
        Ok(Response::new(CudaSharedMemoryStatusResponse { regions }))
    }

    async fn cuda_shared_memory_register(
        &self,
        req: Request<CudaSharedMemoryRegisterRequest>,
    ) -> GrpcResult<CudaSharedMemoryRegisterResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let r = req.into_inner();
        let shm = self.state.shared_memory();
        shm.check_allowed()?;
        let handle = IpcHandle::from_slice(&r.raw_handle).ok_or_else(|| {
            Error::invalid(format!(
                "'raw_handle' must be a {HANDLE_BYTES}-byte cudaIpcMemHandle_t, got {} bytes",
                r.raw_handle.len()
            ))
        })?;
        shm.register_cuda(caller.as_ref(), &r.name, handle, r.device_id, r.byte_size).await?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        req: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> GrpcResult<CudaSharedMemoryUnregisterResponse> {
        let caller = self.caller(&req, Role::Inference).await?;
        let name = req.into_inner().name;
        self.state.shared_memory().unregister(caller.as_ref(), Kind::Cuda, (!name.is_empty()).then_some(&*name))?;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(&self, req: Request<TraceSettingRequest>) -> GrpcResult<TraceSettingResponse> {
        // The whole server's settings: with authentication on, a platform admin's.
        self.caller(&req, Role::PlatformAdmin).await?;
        Ok(Response::new(trace::trace_setting(&self.state, req.into_inner())?))
    }

    async fn log_settings(&self, req: Request<LogSettingsRequest>) -> GrpcResult<LogSettingsResponse> {
        // The whole process's settings: with authentication on, a platform admin's.
        self.caller(&req, Role::PlatformAdmin).await?;
        Ok(Response::new(logging::log_settings(req.into_inner())?))
    }
}

/// What every request of one stream shares: the server, the caller and the stream's
/// `traceparent` metadata.
#[derive(Clone)]
struct Stream {
    state: Arc<ServerState>,
    caller: Option<Arc<Principal>>,
    traceparent: Option<Arc<str>>,
}

/// Where a stream's answers go: the response stream, in order; an `Err` ends it with that status.
type StreamSender = tokio::sync::mpsc::Sender<Result<ModelStreamInferResponse, Status>>;

/// Reads one stream's requests and answers each in order. A message that cannot be read has
/// no request id to answer in-band, and tonic cannot read on past it, so it ends the stream
/// with its status once the requests before it are answered. (Triton's handler takes a failed
/// read for the end of the client's writes and ends with OK, which hides the dropped messages;
/// only gRPC's own size limit ends its stream with RESOURCE_EXHAUSTED.)
async fn run_stream(stream: Stream, mut incoming: Streaming<ModelInferRequest>, tx: StreamSender) {
    let mut pending = FuturesOrdered::new();
    let (mut received, mut open, mut unreadable) = (0u64, true, None);
    loop {
        tokio::select! {
            msg = incoming.next(), if open && pending.len() < STREAM_IN_FLIGHT => match msg {
                Some(Ok(request)) => {
                    received += 1;
                    pending.push_back(stream_infer(stream.clone(), request));
                }
                Some(Err(status)) => {
                    tracing::debug!(error = %status, "stream message could not be read");
                    (open, unreadable) = (false, Some(unreadable_message(received + 1, &status)));
                }
                None => open = false,
            },
            Some(message) = pending.next(), if !pending.is_empty() => {
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
            else => break,
        }
    }
    if let Some(status) = unreadable {
        // A client that already left cannot be told.
        let _ = tx.send(Err(status)).await;
    }
}

/// One stream request's answer: the response, or the error in-band with the request's id,
/// model and version so that the client knows which request failed (as Triton fills in the id).
async fn stream_infer(stream: Stream, request: ModelInferRequest) -> ModelStreamInferResponse {
    let failed = ModelInferResponse {
        id: request.id.clone(),
        model_name: request.model_name.clone(),
        model_version: request.model_version.clone(),
        ..Default::default()
    };
    let traceparent = || stream.traceparent.as_deref();
    match InferenceService::infer(&stream.state, stream.caller.as_deref(), request, &traceparent).await {
        Ok(response) => ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) },
        Err(e) => ModelStreamInferResponse { error_message: e.message, infer_response: Some(failed) },
    }
}

/// The status that ends a stream at its `index`-th message (from 1), which tonic could not read.
fn unreadable_message(index: u64, status: &Status) -> Status {
    let (code, reason) = match convert::codec_error(status) {
        Some(err) => (err.codes().1, err.message),
        None => (status.code(), status.message().to_string()),
    };
    Status::new(code, format!("stream message {index} could not be read, so the stream ends here: {reason}"))
}

/// Runs `producer` on a task and exposes what it sends as the response stream.
fn async_stream_ordered<F, Fut>(producer: F) -> StreamOut
where
    F: FnOnce(StreamSender) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // Capacity bounds how far the server runs ahead of a slow reader.
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(producer(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

struct HealthService {
    state: Arc<ServerState>,
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, _: Request<HealthCheckRequest>) -> GrpcResult<HealthCheckResponse> {
        let status = if self.state.is_ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
        Ok(Response::new(HealthCheckResponse { status: status as i32 }))
    }
}

#[cfg(test)]
mod tests;
