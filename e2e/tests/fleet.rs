//! The circuit breaker's latch on the real API server: it opens, stays open across an operator
//! restart and past its window while one more node drifts alone, and closes with `kubectl
//! gpunode close-breaker` (the built plugin, run with the admin kubeconfig), after which the held
//! nodes are cordoned. The fleet cap's storms are in `storms.rs`.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::{
    GpuNodePolicy,
    policy::{BreakerClosedBy, CircuitBreakerStatus},
};
use gpunode_e2e::{
    chart,
    cluster::{self, admin_client},
    crds, nodes,
    operator::InProcess,
    probe, reports,
    scratch::rand_suffix,
    storm::{make_nodes, pool_selector, remove_leftovers},
    wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::DeleteParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// What `kubectl-gpunode ARGS` printed and how it exited.
async fn plugin(args: &[&str]) -> (i32, String, String) {
    let bin = probe::built("kubectl-gpunode").unwrap();
    let kubeconfig = cluster::admin_kubeconfig().await.unwrap();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `node`'s probe now reports a driver older than the policy's.
async fn old_driver(client: &Client, node: &str) {
    reports::publish_status(client, node, reports::one_gpu("535.129.03", "boot-1", json!([])))
        .await
        .unwrap();
}

async fn breaker_status(api: &Api<GpuNodePolicy>, name: &str) -> Option<CircuitBreakerStatus> {
    api.get(name).await.ok()?.status?.circuit_breaker
}

#[tokio::test]
async fn the_breaker_stays_open_across_a_restart_and_its_window_until_close_breaker() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    remove_leftovers(&client).await.unwrap();
    let run = format!("{:06x}", rand_suffix());
    let names: Vec<String> = (0..4).map(|i| format!("brk-{run}-{i}")).collect();
    make_nodes(&client, &run, "brk", &names).await.unwrap();
    for n in &names {
        reports::publish(&client, n, reports::one_gpu("550.54.15", "boot-1", json!([])))
            .await
            .unwrap();
    }
    let policy = format!("brk-{run}");
    crds::create_policy(
        &client,
        &policy,
        json!({
            "nodeSelector": pool_selector(&run, "brk"),
            "gpu": {"driverVersion": ">=550"},
            // `after`: the two drifts below are two report writes; without it the first could
            // be cordoned before the second is seen (one drifting node never opens the breaker).
            "remediation": [{"classes": ["Driver"], "action": "Cordon", "after": "20s"}],
            "disruption": {"maxUnavailable": "100%",
                           "circuitBreaker": {"maxDriftedPercent": 25, "window": "1m"}},
            "staleAfter": "10m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-breaker");
    for n in &names {
        nodes::until_labelled(&client, n, &[("gpunode.dev/state", "compliant")], DEADLINE)
            .await
            .unwrap();
    }
    let (code, _, stderr) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is closed: nothing to close"), "{stderr}");

    // Two of four drift at once: above 25% (one node), the breaker opens.

    old_driver(&client, &names[0]).await;
    old_driver(&client, &names[1]).await;
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    let opened = wait::until("the breaker open", DEADLINE, || async {
        Ok(breaker_status(&policies, &policy)
            .await
            .filter(|b| b.open)
            .and_then(|b| b.opened_at))
    })
    .await
    .unwrap();
    let p = policies.get(&policy).await.unwrap();
    let c = p
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "CircuitOpen")
        .cloned()
        .unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains(&format!("kubectl gpunode close-breaker {policy}")),
        "{}",
        c.message
    );

    // A restart: the new operator reads the open breaker back from the status.
    operator.stop().await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-breaker-2");
    // Past the window a third node drifts, alone in it: held all the same.
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("the window passed", Duration::from_secs(90), || async {
        Ok((jiff::Timestamp::now() > opened.0 + jiff::SignedDuration::from_secs(65)).then_some(()))
    })
    .await
    .unwrap();
    old_driver(&client, &names[2]).await;
    let held = wait::until("the third node held by the breaker", DEADLINE, || async {
        let n = node_api.get(&names[2]).await?;
        let message = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        Ok(message.contains("circuit breaker open").then_some(n))
    })
    .await
    .unwrap();
    assert!(!nodes::cordoned(&held));
    for n in &names[..3] {
        assert!(!nodes::cordoned(&node_api.get(n).await.unwrap()), "{n} cordoned");
    }
    assert!(breaker_status(&policies, &policy).await.unwrap().open);

    let (code, stdout, stderr) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 0, "{stderr}");
    let at = opened.0.to_string();
    assert_eq!(
        stdout,
        format!(
            "gpunodepolicy/{policy}: closing the circuit breaker opened at {at} (gpunode.dev/close-breaker={at}); the operator resumes on its next pass\n"
        )
    );
    wait::until("the held nodes cordoned once closed", DEADLINE, || async {
        let mut all = true;
        for n in &names[..3] {
            all &= nodes::cordoned(&node_api.get(n).await?);
        }
        Ok(all.then_some(()))
    })
    .await
    .unwrap();
    // The status trails the nodes by at most its pacing interval.
    wait::until("the status says a person closed it", DEADLINE, || async {
        let b = breaker_status(&policies, &policy).await;
        Ok(b.filter(|b| !b.open && b.closed_by == Some(BreakerClosedBy::Person)))
    })
    .await
    .unwrap();
    let (code, _, _) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 2, "closed already");

    let _ = policies.delete(&policy, &DeleteParams::default()).await;
    wait::until("the policy gone", DEADLINE, || async {
        Ok(policies.get_opt(&policy).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    operator.stop().await.unwrap();
    for n in &names {
        let _ = node_api.delete(n, &DeleteParams::default()).await;
    }
}
