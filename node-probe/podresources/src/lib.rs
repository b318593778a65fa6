//! The kubelet's PodResources API (`v1.PodResourcesLister`), as much of it as the probe reads:
//! which pods the device plugins allocated which devices to. The kubelet serves it as gRPC on a
//! unix socket (`/var/lib/kubelet/pod-resources/kubelet.sock`); the probe mounts its directory
//! read-only and calls `List`.
//!
//! The messages are written by hand with prost's derive (field numbers as in the kubelet's
//! `api.proto`); the fields gpunode does not read (CPU ids, memory, topology, dynamic resources)
//! are left out and skipped when decoding, as protobuf allows.

use std::{path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tonic::{
    codegen::http::{Uri, uri::PathAndQuery},
    transport::Endpoint,
};

#[cfg(feature = "fake")]
pub mod fake;

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The gRPC service.
pub const SERVICE: &str = "v1.PodResourcesLister";
/// The `List` method's path.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// `ListPodResourcesRequest` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`: every pod of the node the kubelet knows, with its resources.
#[derive(Clone, PartialEq, prost::Message)]
#[cfg_attr(feature = "fake", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "fake", serde(rename_all = "camelCase", default))]
pub struct ListPodResourcesResponse {
    /// The pods.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: one pod.
#[derive(Clone, PartialEq, prost::Message)]
#[cfg_attr(feature = "fake", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "fake", serde(rename_all = "camelCase", default))]
pub struct PodResources {
    /// The pod's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The pod's namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`: one container's devices.
#[derive(Clone, PartialEq, prost::Message)]
#[cfg_attr(feature = "fake", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "fake", serde(rename_all = "camelCase", default))]
pub struct ContainerResources {
    /// The container's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The devices allocated to it, by resource.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the devices of one resource allocated to a container.
#[derive(Clone, PartialEq, prost::Message)]
#[cfg_attr(feature = "fake", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "fake", serde(rename_all = "camelCase", default))]
pub struct ContainerDevices {
    /// The extended resource, for example `nvidia.com/gpu`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// The device plugin's ids of the devices (the NVIDIA plugin: GPU UUIDs by default, indexes
    /// with `DEVICE_ID_STRATEGY=index`, `UUID::n` for a time-sliced replica).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// Why `List` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The socket could not be connected to.
    #[error("cannot connect to the kubelet's PodResources socket {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The call failed.
    #[error("PodResources List on {path} failed: {code:?}: {message}")]
    Call {
        /// The socket.
        path: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// No answer in time.
    #[error("PodResources List on {path}: no answer within {timeout:?}")]
    Timeout {
        /// The socket.
        path: String,
        /// The deadline.
        timeout: Duration,
    },
}

/// Calls `List` on the kubelet's socket at `socket`, giving up after `timeout` in all.
pub async fn list(socket: &Path, timeout: Duration) -> Result<Vec<PodResources>, ListError> {
    let path = socket.display().to_string();
    match tokio::time::timeout(timeout, call(socket, &path)).await {
        Ok(result) => result,
        Err(_) => Err(ListError::Timeout { path, timeout }),
    }
}

async fn call(socket: &Path, path: &str) -> Result<Vec<PodResources>, ListError> {
    let target = socket.to_path_buf();
    // The URI is only a placeholder: the connector dials the unix socket.
    let channel = Endpoint::from_static("http://kubelet.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let target = target.clone();
            async move { tokio::net::UnixStream::connect(target).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| ListError::Connect {
            path: path.to_string(),
            source,
        })?;
    let failed = |s: tonic::Status| ListError::Call {
        path: path.to_string(),
        code: s.code(),
        message: s.message().to_string(),
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| failed(tonic::Status::unavailable(e.to_string())))?;
    let answer = grpc
        .unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            PathAndQuery::from_static(LIST_PATH),
            tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default(),
        )
        .await
        .map_err(failed)?;
    Ok(answer.into_inner().pod_resources)
}
