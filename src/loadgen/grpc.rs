//! KServe v2 over gRPC: the generated tonic client, inputs in `raw_input_contents`, workers
//! multiplexed over a few HTTP/2 channels.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_protocol::DataType;
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tessera_protocol::inference::model_infer_request::InferInputTensor;
use tessera_protocol::inference::model_metadata_response::TensorMetadata;
use tessera_protocol::inference::{
    ModelConfigRequest, ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelStatisticsRequest,
};
use tonic::transport::{Channel, Endpoint};

use super::stats::ServerStats;
use super::tensors::{InputData, ModelInfo, OutputCheck, ResponseTensor, TensorMeta};
use super::{Target, Worker};

/// The generated client over one channel.
pub type Client = GrpcInferenceServiceClient<Channel>;

/// Opens `count` channels (HTTP/2 connections) to `target`.
pub async fn connect(target: &Target, count: usize) -> Result<Vec<Client>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{}", target.addr))
        .map_err(|e| format!("invalid address '{}': {e}", target.addr))?
        .tcp_nodelay(true);
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let channel = endpoint.connect().await.map_err(|e| format!("connect to {}: {}", target.addr, chain(&e)))?;
        clients.push(Client::new(channel).max_decoding_message_size(usize::MAX).max_encoding_message_size(usize::MAX));
    }
    Ok(clients)
}

/// An error and its sources: tonic's transport errors say little on their own.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn status_message(status: &tonic::Status) -> String {
    format!("gRPC {:?}: {}", status.code(), status.message())
}

/// Model metadata plus `max_batch_size` from the configuration.
pub async fn model_info(client: &mut Client, target: &Target) -> Result<ModelInfo, String> {
    let name = target.model.clone();
    let version = target.version.clone().unwrap_or_default();
    let metadata = client
        .model_metadata(ModelMetadataRequest { name: name.clone(), version: version.clone() })
        .await
        .map_err(|s| format!("model metadata: {}", status_message(&s)))?
        .into_inner();
    let tensors = |list: &[TensorMetadata]| list.iter().map(tensor_meta).collect::<Result<Vec<_>, _>>();
    let (inputs, outputs) = (tensors(&metadata.inputs)?, tensors(&metadata.outputs)?);
    let batching = match client.model_config(ModelConfigRequest { name, version }).await {
        Ok(config) => config.into_inner().config.is_some_and(|c| c.max_batch_size > 0),
        // Without the configuration extension, a variable first dimension means batching.
        Err(_) => inputs.iter().all(|i| i.shape.first() == Some(&-1)),
    };
    Ok(ModelInfo { inputs, outputs, batching })
}

fn tensor_meta(t: &TensorMetadata) -> Result<TensorMeta, String> {
    let datatype = DataType::from_wire(&t.datatype).ok_or_else(|| format!("tensor '{}': unknown datatype", t.name))?;
    Ok(TensorMeta { name: t.name.clone(), datatype, shape: t.shape.clone() })
}

/// The model's statistics, summed over the versions reported.
pub async fn stats(client: &mut Client, target: &Target) -> Result<ServerStats, String> {
    let request =
        ModelStatisticsRequest { name: target.model.clone(), version: target.version.clone().unwrap_or_default() };
    let response = client.model_statistics(request).await.map_err(|s| format!("statistics: {}", status_message(&s)))?;
    Ok(ServerStats::from_proto(&response.into_inner().model_stats))
}

/// The request every worker clones; tensor bytes are shared, not copied.
pub fn infer_request(target: &Target, inputs: &[InputData]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: target.model.clone(),
        model_version: target.version.clone().unwrap_or_default(),
        id: String::new(),
        parameters: HashMap::new(),
        inputs: inputs
            .iter()
            .map(|i| InferInputTensor {
                name: i.name.clone(),
                datatype: i.datatype.as_wire().to_string(),
                shape: i.shape.clone(),
                parameters: HashMap::new(),
                contents: None,
            })
            .collect(),
        outputs: Vec::new(),
        raw_input_contents: inputs.iter().map(|i| i.data.clone()).collect(),
    }
}

/// Checks a response: one raw buffer per output, in order.
pub fn check_infer_response(check: &OutputCheck, response: &ModelInferResponse) -> Result<(), String> {
    if response.raw_output_contents.len() != response.outputs.len() {
        return Err("raw_output_contents does not match the outputs".into());
    }
    check.check(response.outputs.iter().zip(&response.raw_output_contents).map(|(o, data)| ResponseTensor {
        name: &o.name,
        datatype: &o.datatype,
        shape: &o.shape,
        data,
    }))
}

/// A load worker: a clone of a shared channel's client and the prepared request.
pub struct GrpcWorker {
    client: Client,
    request: ModelInferRequest,
    check: Arc<OutputCheck>,
}

impl GrpcWorker {
    /// A worker sending `request` on `client`'s channel.
    pub fn new(client: Client, request: ModelInferRequest, check: Arc<OutputCheck>) -> Self {
        Self { client, request, check }
    }
}

impl Worker for GrpcWorker {
    async fn infer(&mut self) -> Result<(), String> {
        let response = self.client.model_infer(self.request.clone()).await.map_err(|s| status_message(&s))?;
        check_infer_response(&self.check, response.get_ref())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tessera_protocol::inference::model_infer_response::InferOutputTensor;

    use super::*;

    #[test]
    fn requests_share_the_input_bytes_and_responses_are_checked() {
        let target = Target { addr: "h:1".into(), model: "m".into(), version: None };
        let data = Bytes::from(vec![0u8; 64]);
        let inputs = [InputData { name: "A".into(), datatype: DataType::Fp32, shape: vec![1, 16], data: data.clone() }];
        let request = infer_request(&target, &inputs);
        assert_eq!(request.raw_input_contents[0].as_ptr(), data.as_ptr(), "no copy of the payload");
        assert_eq!(request.inputs[0].datatype, "FP32");

        let meta = TensorMeta { name: "Y".into(), datatype: DataType::Fp32, shape: vec![-1, 16] };
        let check = ModelInfo { inputs: vec![], outputs: vec![meta], batching: true }.output_check(1);
        let output =
            InferOutputTensor { name: "Y".into(), datatype: "FP32".into(), shape: vec![1, 16], ..Default::default() };
        let mut response =
            ModelInferResponse { outputs: vec![output], raw_output_contents: vec![data.clone()], ..Default::default() };
        check_infer_response(&check, &response).expect("good");
        response.raw_output_contents[0] = data.slice(..60);
        assert!(check_infer_response(&check, &response).is_err());
        response.raw_output_contents.clear();
        assert!(check_infer_response(&check, &response).is_err());
    }
}
