//! The client against the fake kubelet over a real unix socket: what the kubelet lists comes back
//! whole; a missing socket, a failing kubelet and one that never answers are typed errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use gpunode_podresources::{
    ContainerDevices, ContainerResources, ListError, ListPodResourcesResponse, PodResources,
    fake::{FakeKubelet, Source, serve},
    list,
};
use tokio::sync::oneshot;

fn answer() -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "trainer-0".into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: vec!["GPU-a".into(), "GPU-b".into()],
                }],
            }],
        }],
    }
}

/// Serves `source` on a socket in a new directory; the sender stops it.
async fn kubelet(source: Source) -> (tempfile::TempDir, std::path::PathBuf, oneshot::Sender<()>) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let (stop, stopped) = oneshot::channel::<()>();
    let path = socket.clone();
    tokio::spawn(async move {
        serve(&path, FakeKubelet::new(source), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    // The socket exists once bound; wait for it with a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fake kubelet never bound its socket"
        );
        tokio::task::yield_now().await;
    }
    (dir, socket, stop)
}

#[tokio::test]
async fn lists_what_the_kubelet_has() {
    let (_dir, socket, stop) = kubelet(Arc::new(|| Ok(answer()))).await;
    let pods = list(&socket, Duration::from_secs(10)).await.unwrap();
    assert_eq!(pods, answer().pod_resources);
    let _ = stop.send(());
}

#[tokio::test]
async fn a_failing_kubelet_is_an_error_with_its_status() {
    let (_dir, socket, stop) = kubelet(Arc::new(|| Err("checkpoint unreadable".to_string()))).await;
    let err = list(&socket, Duration::from_secs(10)).await.unwrap_err();
    match &err {
        ListError::Call { code, message, .. } => {
            assert_eq!(*code, tonic::Code::Unavailable);
            assert_eq!(message, "checkpoint unreadable");
        }
        other => panic!("expected a call error, got {other:?}"),
    }
    let _ = stop.send(());
}

#[tokio::test]
async fn no_socket_is_a_connect_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let err = list(&socket, Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(err, ListError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

#[tokio::test]
async fn a_kubelet_that_never_answers_times_out() {
    // A socket that accepts connections and never speaks HTTP/2.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mute.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let err = list(&socket, Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(err, ListError::Timeout { .. }), "{err:?}");
    held.abort();
}
