//! One active replica: leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Every replica computes; only the leader writes (linkerd: followers compute, never write).
//! [`Leadership::run`] acquires and renews the Lease with optimistic concurrency (replace with the
//! `resourceVersion` it read, create when missing) and publishes the outcome through
//! [`Leadership::is_leader`] and [`Leadership::subscribe`].
//!
//! Safety: a leader considers itself leader only until `start + renewDeadline`, where `start` is
//! when its last successful renewal began. Another replica takes the Lease over only once the
//! record has stayed unchanged for `leaseDuration` by its own monotonic clock. Since every renewal
//! is written after it began, and `renewDeadline < leaseDuration`, the old leader stops (its flag
//! turns false even if its task is stuck: [`Leadership::is_leader`] checks the deadline itself)
//! strictly before a new one can start. No wall clock is consulted, so skew between the
//! replicas' clocks neither hastens nor delays a takeover (the reliability suite runs a follower
//! 20 s ahead and 20 s behind: an earlier rule that also waited for `renewTime +
//! leaseDurationSeconds` by the wall clock made the one behind take 36 s instead of 15).
//!
//! On graceful shutdown the leader steps down first, then releases the Lease (clears
//! `holderIdentity`) if the record still names it, so a follower takes over at its next retry
//! instead of waiting for the Lease to expire.
//!
//! Why not a crate (kube-lease-manager, kubert's lease): they report leadership through a value
//! their renewing task updates, which stays "leader" for as long as that task is stalled (a
//! paused process resumes believing it leads), and they judge a Lease's expiry from its
//! `renewTime` by the wall clock, tolerating a configured skew. The write fence
//! ([`crate::apply::Applier::with_gate`]) needs a flag that expires on its own once the renew
//! deadline passes by this process's monotonic clock, which is what this module is.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};
use tokio::{sync::watch, time::Instant};
use tracing::Instrument;

/// How long a Lease is valid after its last renewal (client-go's default).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader keeps leading without a successful renewal (client-go's default).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often to renew (leader) or try to acquire (follower) (client-go's default).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// The name of the operator's Lease.
pub const DEFAULT_LEASE_NAME: &str = "gpunode-operator";

/// Why leader election could not run (or one attempt failed).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The configuration breaks an invariant (e.g. `renewDeadline >= leaseDuration`).
    #[error("invalid leader election configuration: {0}")]
    Config(String),
    /// Neither `POD_NAME` nor a hostname names this replica.
    #[error("no holder identity for the leader election Lease: set POD_NAME")]
    NoIdentity,
    /// `run` was called twice on the same [`Leadership`] (or on a fixed one).
    #[error("leader election is already running for this Leadership")]
    AlreadyRunning,
    /// A request on the Lease failed.
    #[error("{op} Lease: {source}")]
    Api {
        /// `get`, `create` or `replace`.
        op: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// A request on the Lease got no answer in time.
    #[error("{op} Lease: no answer within {after:?}")]
    Timeout {
        /// What was attempted.
        op: &'static str,
        /// The time allowed.
        after: Duration,
    },
}

/// Where the Lease lives, who we are, and the timing of the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Holder identity: unique per replica (the pod name).
    pub identity: String,
    /// How long the Lease is valid after a renewal (`leaseDurationSeconds`, rounded up to
    /// whole seconds when written).
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal; `< lease_duration`.
    pub renew_deadline: Duration,
    /// Time between attempts (renewals and acquisition tries); `< renew_deadline`.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// A configuration with client-go's default timing (15 s / 10 s / 2 s).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Like [`LeaderConfig::new`], naming this replica after [`default_identity`].
    pub fn from_env(namespace: impl Into<String>, name: impl Into<String>) -> Result<Self, LeaderError> {
        let identity = default_identity().ok_or(LeaderError::NoIdentity)?;
        Ok(LeaderConfig::new(namespace, name, identity))
    }

    /// Sets the three durations.
    pub fn with_timing(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self
    }

    /// Checks `0 < retry_period < renew_deadline < lease_duration` and non-empty names.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let fail = |m: String| Err(LeaderError::Config(m));
        if self.namespace.is_empty() || self.name.is_empty() {
            return fail("the Lease namespace and name must not be empty".into());
        }
        if self.identity.is_empty() {
            return Err(LeaderError::NoIdentity);
        }
        if self.retry_period.is_zero() {
            return fail("retryPeriod must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return fail(format!(
                "renewDeadline ({:?}) must be longer than retryPeriod ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return fail(format!(
                "leaseDuration ({:?}) must be longer than renewDeadline ({:?}): a leader must stop \
                 before its Lease can expire for the others",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return fail("leaseDuration is too long".into());
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as written: whole seconds, rounded up (never shorter than the
    /// duration this replica's safety relies on).
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX).max(1)
    }
}

/// This replica's holder identity: `POD_NAME`, else `HOSTNAME`, else the kernel's hostname.
pub fn default_identity() -> Option<String> {
    let from_env = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_string());
    let from_file = |p: &str| std::fs::read_to_string(p).ok().map(|v| v.trim().to_string());
    from_env("POD_NAME")
        .filter(|v| !v.is_empty())
        .or_else(|| from_env("HOSTNAME").filter(|v| !v.is_empty()))
        .or_else(|| from_file("/proc/sys/kernel/hostname").filter(|v| !v.is_empty()))
        .or_else(|| from_file("/etc/hostname").filter(|v| !v.is_empty()))
}

/// What a candidate does with the Lease it has just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, holding it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it (released, or never held) or the holder's Lease expired: take it over.
    Acquire {
        /// The holder whose Lease expired; `None` when it was free.
        previous: Option<String>,
    },
    /// Someone else holds a live Lease.
    Wait {
        /// The holder.
        holder: String,
        /// How long at least until it could expire (for logs).
        remaining: Duration,
    },
}

/// Decides what to do with `lease` (`None`: it does not exist) as `me`, when this record (its
/// `resourceVersion`) has been seen unchanged for `unchanged_for` by the local monotonic clock.
/// `default_duration` applies when the record has no usable `leaseDurationSeconds`.
///
/// Someone else's Lease is taken over only once it has not changed for its duration locally; its
/// `renewTime` is another replica's wall clock and says nothing this replica can trust.
pub fn decide(
    lease: Option<&Lease>,
    me: &str,
    unchanged_for: Duration,
    default_duration: Duration,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let Some(spec) = lease.spec.as_ref() else {
        return Decision::Acquire { previous: None };
    };
    let holder = match spec.holder_identity.as_deref() {
        None | Some("") => return Decision::Acquire { previous: None },
        Some(h) if h == me => return Decision::Renew,
        Some(h) => h,
    };
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    let remaining = duration.saturating_sub(unchanged_for);
    if remaining.is_zero() {
        Decision::Acquire {
            previous: Some(holder.to_string()),
        }
    } else {
        Decision::Wait {
            holder: holder.to_string(),
            remaining,
        }
    }
}

/// The spec that holds (or keeps holding) the Lease for `me` at `now`: a renewal keeps
/// `acquireTime` and `leaseTransitions`; a change of holder (including from nobody) sets
/// `acquireTime` and counts a transition. Other fields (`preferredHolder`, `strategy`) are kept.
pub fn next_spec(
    current: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    lease_duration_seconds: i32,
) -> LeaseSpec {
    let mut spec = current.cloned().unwrap_or_default();
    let renewing = spec.holder_identity.as_deref() == Some(me);
    if !renewing {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(match current {
            None => 0,
            Some(c) => c.lease_transitions.unwrap_or(0).saturating_add(1),
        });
    } else if spec.acquire_time.is_none() {
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.holder_identity = Some(me.to_string());
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(lease_duration_seconds);
    spec
}

/// The spec of a released Lease: no holder, renewed `now`, so any candidate takes it at once.
pub fn released_spec(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        renew_time: Some(MicroTime(now)),
        ..current.clone()
    }
}

/// Whether this replica leads. Cheap to clone and to query; gate every write on
/// [`Leadership::is_leader`] right before making it.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` until which we lead; 0: not leading; `u64::MAX`: for ever.
    valid_until: AtomicU64,
    /// The published flag.
    tx: watch::Sender<bool>,
    /// `run` is in progress.
    running: AtomicBool,
}

/// A follower whose attempts keep failing warns on the first failure and every this many after.
const FOLLOWER_WARN_EVERY: u64 = 30;

const NOT_LEADING: u64 = 0;
const FOREVER: u64 = u64::MAX;

impl Default for Leadership {
    fn default() -> Self {
        Leadership::new()
    }
}

impl Leadership {
    /// Not leading until [`Leadership::run`] acquires the Lease.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Leadership {
            inner: Arc::new(Inner {
                base: Instant::now(),
                valid_until: AtomicU64::new(NOT_LEADING),
                tx,
                running: AtomicBool::new(false),
            }),
        }
    }

    /// A fixed answer, without election: `true` for a single replica run without a Lease
    /// (and for tests of code gated on leadership), `false` for a replica that must never write.
    /// [`Leadership::run`] refuses to run on it.
    pub fn fixed(leader: bool) -> Self {
        let (tx, _) = watch::channel(leader);
        Leadership {
            inner: Arc::new(Inner {
                base: Instant::now(),
                valid_until: AtomicU64::new(if leader { FOREVER } else { NOT_LEADING }),
                tx,
                running: AtomicBool::new(true),
            }),
        }
    }

    /// Whether this replica leads now. Turns false by itself once the renew deadline passes,
    /// even if the election task is stuck.
    pub fn is_leader(&self) -> bool {
        match self.inner.valid_until.load(Ordering::Acquire) {
            NOT_LEADING => false,
            FOREVER => true,
            until => self.ticks(Instant::now()) < until,
        }
    }

    /// Whether [`Leadership::run`] is in progress (always true for a fixed Leadership): a
    /// liveness check can fail when the election task has died.
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::Acquire)
    }

    /// Follows the flag: `true` on acquiring, `false` on losing or stepping down.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.tx.subscribe()
    }

    fn ticks(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.inner.base).as_nanos();
        u64::try_from(nanos).unwrap_or(FOREVER - 1).clamp(1, FOREVER - 1)
    }

    /// Leads until `until`; true when this is a change.
    fn promote(&self, until: Instant) -> bool {
        self.inner.valid_until.store(self.ticks(until), Ordering::Release);
        self.inner.tx.send_if_modified(|v| !std::mem::replace(v, true))
    }

    /// Stops leading; true when this is a change.
    fn demote(&self) -> bool {
        self.inner.valid_until.store(NOT_LEADING, Ordering::Release);
        self.inner.tx.send_if_modified(|v| std::mem::replace(v, false))
    }

    /// Runs the election until `shutdown` completes, then steps down and releases the Lease if
    /// this replica holds it. Failed attempts are logged and retried every `retry_period`; a
    /// leader that cannot renew within `renew_deadline` steps down. If this future is dropped
    /// (the task aborted), the flag turns false and the Lease is left to expire.
    ///
    /// Errors only when the configuration is invalid or another `run` is in progress.
    pub async fn run<F>(&self, client: Client, config: LeaderConfig, shutdown: F) -> Result<(), LeaderError>
    where
        F: Future<Output = ()>,
    {
        config.validate()?;
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return Err(LeaderError::AlreadyRunning);
        }
        let _guard = RunGuard(self);
        let span = tracing::info_span!(
            "leader_election",
            lease = %format!("{}/{}", config.namespace, config.name),
            identity = %config.identity,
        );
        let mut elector = Elector {
            api: Api::namespaced(client, &config.namespace),
            config: &config,
            observed: None,
        };
        self.elect(&mut elector, shutdown).instrument(span).await;
        Ok(())
    }

    async fn elect<F>(&self, elector: &mut Elector<'_>, shutdown: F)
    where
        F: Future<Output = ()>,
    {
        let config = elector.config;
        tokio::pin!(shutdown);
        // Until when we lead, as far as the loop knows.
        let mut leading_until: Option<Instant> = None;
        // Failed attempts in a row.
        let mut failures: u64 = 0;
        tracing::info!(
            lease_duration = ?config.lease_duration,
            renew_deadline = ?config.renew_deadline,
            retry_period = ?config.retry_period,
            "leader election started"
        );
        loop {
            let start = Instant::now();
            let budget = match leading_until {
                Some(until) if until > start => until - start,
                Some(_) => {
                    leading_until = None;
                    self.step_down("could not renew the Lease within the renew deadline");
                    config.renew_deadline
                }
                None => config.renew_deadline,
            };
            let result = tokio::select! {
                biased;
                () = &mut shutdown => break,
                r = tokio::time::timeout(budget, elector.attempt()) => r,
            };
            let now = Instant::now();
            let outcome = result.unwrap_or(Err(LeaderError::Timeout {
                op: "acquire or renew",
                after: budget,
            }));
            self.on_attempt(
                outcome,
                start + config.renew_deadline,
                now,
                &mut leading_until,
                &mut failures,
            );
            if leading_until.is_some_and(|until| until <= now) {
                leading_until = None;
                self.step_down("could not renew the Lease within the renew deadline");
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(start + config.retry_period) => {}
            }
        }
        if self.demote() {
            tracing::info!("stepping down: shutting down");
        }
        release(elector).await;
    }

    /// Acts on one attempt's outcome: leading until `renew_by` (the attempt's start plus the
    /// renew deadline), following another replica, a race, or a failure logged (a follower's
    /// persistent failures every [`FOLLOWER_WARN_EVERY`]th time).
    fn on_attempt(
        &self,
        outcome: Result<Attempt, LeaderError>,
        renew_by: Instant,
        now: Instant,
        leading_until: &mut Option<Instant>,
        failures: &mut u64,
    ) {
        if outcome.is_ok() {
            *failures = 0;
        }
        match outcome {
            Ok(Attempt::Leading {
                previous,
                transitions,
            }) => {
                if renew_by > now {
                    *leading_until = Some(renew_by);
                    if self.promote(renew_by) {
                        tracing::info!(
                            previous = previous.as_deref().unwrap_or(""),
                            transitions,
                            "became leader"
                        );
                    } else {
                        tracing::trace!("renewed the Lease");
                    }
                }
            }
            Ok(Attempt::Following { holder, remaining }) => {
                *leading_until = None;
                if self.demote() {
                    tracing::warn!(%holder, "lost leadership: another replica holds the Lease");
                } else {
                    tracing::debug!(%holder, ?remaining, "following");
                }
            }
            Ok(Attempt::Raced) => {
                tracing::debug!("the Lease changed while we wrote it; retrying");
            }
            Err(error) => {
                *failures += 1;
                if leading_until.is_some() {
                    tracing::warn!(%error, "could not renew the Lease");
                } else if *failures % FOLLOWER_WARN_EVERY == 1 {
                    // Persistent failures (RBAC, network) are visible without flooding.
                    tracing::warn!(%error, failures = *failures, "could not read or acquire the Lease");
                } else {
                    tracing::debug!(%error, failures = *failures, "could not read or acquire the Lease");
                }
            }
        }
    }

    fn step_down(&self, reason: &str) {
        if self.demote() {
            tracing::warn!(reason, "lost leadership");
        }
    }
}

/// Releases the Lease on the way out, within the renew deadline; otherwise it expires.
async fn release(elector: &mut Elector<'_>) {
    let config = elector.config;
    match tokio::time::timeout(config.renew_deadline, elector.release()).await {
        Ok(Ok(true)) => tracing::info!("released the Lease"),
        Ok(Ok(false)) => tracing::debug!("not holding the Lease; nothing to release"),
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not release the Lease; it will expire instead");
        }
        Err(_) => tracing::warn!(
            after = ?config.renew_deadline,
            "releasing the Lease got no answer; it will expire instead"
        ),
    }
}

/// Clears the flag and the running mark when `run` ends or is dropped.
struct RunGuard<'a>(&'a Leadership);

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if self.0.demote() {
            tracing::warn!("leader election stopped while leading; the Lease is left to expire");
        }
        self.0.inner.running.store(false, Ordering::Release);
    }
}

/// The result of one attempt.
enum Attempt {
    /// We hold the Lease (created, acquired or renewed).
    Leading {
        previous: Option<String>,
        transitions: i32,
    },
    /// Another replica holds a live Lease.
    Following { holder: String, remaining: Duration },
    /// Our write lost a race (conflict, or someone else created the Lease first).
    Raced,
}

struct Elector<'a> {
    api: Api<Lease>,
    config: &'a LeaderConfig,
    /// The record's `resourceVersion` and when this replica first saw it.
    observed: Option<(String, Instant)>,
}

impl Elector<'_> {
    /// How long the record has been seen unchanged; starts the clock on a new version.
    fn observe(&mut self, lease: Option<&Lease>, at: Instant) -> Duration {
        let Some(version) = lease.and_then(|l| l.metadata.resource_version.as_deref()) else {
            self.observed = None;
            return Duration::ZERO;
        };
        match &self.observed {
            Some((seen, since)) if seen == version => at.saturating_duration_since(*since),
            _ => {
                self.observed = Some((version.to_string(), at));
                Duration::ZERO
            }
        }
    }

    async fn attempt(&mut self) -> Result<Attempt, LeaderError> {
        let config = self.config;
        let current = self
            .api
            .get_opt(&config.name)
            .await
            .map_err(|source| LeaderError::Api { op: "get", source })?;
        let unchanged_for = self.observe(current.as_ref(), Instant::now());
        let now = Timestamp::now();
        let decision = decide(
            current.as_ref(),
            &config.identity,
            unchanged_for,
            config.lease_duration,
        );
        let previous = match decision {
            Decision::Wait { holder, remaining } => {
                return Ok(Attempt::Following { holder, remaining });
            }
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(config.name.clone()),
                        namespace: Some(config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(next_spec(
                        None,
                        &config.identity,
                        now,
                        config.lease_duration_seconds(),
                    )),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.observe(Some(&created), Instant::now());
                        Ok(Attempt::Leading {
                            previous: None,
                            transitions: 0,
                        })
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Raced),
                    Err(source) => Err(LeaderError::Api { op: "create", source }),
                };
            }
            Decision::Renew => None,
            Decision::Acquire { previous } => previous,
        };
        let Some(mut lease) = current else {
            return Ok(Attempt::Raced);
        };
        let spec = next_spec(
            lease.spec.as_ref(),
            &config.identity,
            now,
            config.lease_duration_seconds(),
        );
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(spec);
        match self
            .api
            .replace(&config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observe(Some(&written), Instant::now());
                Ok(Attempt::Leading {
                    previous,
                    transitions,
                })
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Raced),
            Err(source) => Err(LeaderError::Api {
                op: "replace",
                source,
            }),
        }
    }

    /// Clears the holder if the record still names us; true when released.
    async fn release(&mut self) -> Result<bool, LeaderError> {
        let config = self.config;
        let current = self
            .api
            .get_opt(&config.name)
            .await
            .map_err(|source| LeaderError::Api { op: "get", source })?;
        let Some(mut lease) = current else {
            return Ok(false);
        };
        let Some(spec) = lease
            .spec
            .as_ref()
            .filter(|s| s.holder_identity.as_deref() == Some(config.identity.as_str()))
        else {
            return Ok(false);
        };
        lease.spec = Some(released_spec(spec, Timestamp::now()));
        match self
            .api
            .replace(&config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(source) => Err(LeaderError::Api {
                op: "replace",
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: Option<i64>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("gpunode-operator".into()),
                namespace: Some("gpunode".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(|s| MicroTime(t(s))),
                acquire_time: renewed.map(|s| MicroTime(t(s - 100))),
                lease_duration_seconds: duration,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn no_lease_is_created() {
        assert_eq!(decide(None, "a", SEC, 15 * SEC), Decision::Create);
    }

    #[test]
    fn our_lease_is_renewed_even_when_expired() {
        let l = lease(Some("a"), Some(0), Some(15));
        assert_eq!(decide(Some(&l), "a", SEC, 15 * SEC), Decision::Renew);
        assert_eq!(decide(Some(&l), "a", 1000 * SEC, 15 * SEC), Decision::Renew);
    }

    #[test]
    fn a_free_lease_is_acquired_at_once() {
        for l in [
            lease(None, Some(0), Some(15)),
            lease(Some(""), Some(0), Some(15)),
            Lease {
                spec: None,
                ..lease(None, None, None)
            },
        ] {
            assert_eq!(
                decide(Some(&l), "a", Duration::ZERO, 15 * SEC),
                Decision::Acquire { previous: None }
            );
        }
    }

    #[test]
    fn a_live_lease_of_another_is_waited_for() {
        let l = lease(Some("b"), Some(0), Some(15));
        assert_eq!(
            decide(Some(&l), "a", 5 * SEC, 15 * SEC),
            Decision::Wait {
                holder: "b".into(),
                remaining: 10 * SEC
            }
        );
    }

    #[test]
    fn an_expired_lease_is_taken_over_by_the_local_clock_whatever_its_stamps_say() {
        // Unchanged locally for 3 s: wait, even if its stamp is long past (our clock may be ahead).
        let l = lease(Some("b"), Some(0), Some(15));
        assert_eq!(
            decide(Some(&l), "a", 3 * SEC, 15 * SEC),
            Decision::Wait {
                holder: "b".into(),
                remaining: 12 * SEC
            }
        );
        // Unchanged locally for its duration: take over, even if stamped in our future (our
        // clock behind theirs).
        for stamp in [0, 100] {
            let l = lease(Some("b"), Some(stamp), Some(15));
            assert_eq!(
                decide(Some(&l), "a", 15 * SEC, 15 * SEC),
                Decision::Acquire {
                    previous: Some("b".into())
                }
            );
        }
    }

    #[test]
    fn the_records_duration_wins_over_ours() {
        let l = lease(Some("b"), Some(0), Some(40));
        assert!(matches!(
            decide(Some(&l), "a", 20 * SEC, 15 * SEC),
            Decision::Wait { .. }
        ));
        // Missing or nonsensical durations fall back to ours.
        for d in [None, Some(0), Some(-5)] {
            let l = lease(Some("b"), Some(0), d);
            assert_eq!(
                decide(Some(&l), "a", 15 * SEC, 15 * SEC),
                Decision::Acquire {
                    previous: Some("b".into())
                }
            );
        }
    }

    #[test]
    fn a_lease_without_times_expires_by_the_local_clock() {
        let l = lease(Some("b"), None, Some(15));
        assert!(matches!(
            decide(Some(&l), "a", 14 * SEC, 15 * SEC),
            Decision::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&l), "a", 15 * SEC, 15 * SEC),
            Decision::Acquire { .. }
        ));
    }

    #[test]
    fn renewing_keeps_acquire_time_and_transitions() {
        let l = lease(Some("a"), Some(0), Some(15));
        let spec = next_spec(l.spec.as_ref(), "a", t(2), 15);
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(-100))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(2))));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.lease_duration_seconds, Some(15));
    }

    #[test]
    fn taking_over_counts_a_transition() {
        for holder in [Some("b"), None] {
            let l = lease(holder, Some(0), Some(15));
            let spec = next_spec(l.spec.as_ref(), "a", t(20), 15);
            assert_eq!(spec.holder_identity.as_deref(), Some("a"));
            assert_eq!(spec.acquire_time, Some(MicroTime(t(20))));
            assert_eq!(spec.renew_time, Some(MicroTime(t(20))));
            assert_eq!(spec.lease_transitions, Some(4));
        }
        let created = next_spec(None, "a", t(0), 15);
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.acquire_time, Some(MicroTime(t(0))));
    }

    #[test]
    fn releasing_clears_only_the_holder() {
        let l = lease(Some("a"), Some(0), Some(15));
        let Some(spec) = l.spec.as_ref() else {
            panic!("fixture has a spec")
        };
        let released = released_spec(spec, t(3));
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.renew_time, Some(MicroTime(t(3))));
        assert_eq!(released.lease_transitions, Some(3));
        assert_eq!(released.acquire_time, spec.acquire_time);
        let after = Lease {
            spec: Some(released),
            ..l
        };
        assert_eq!(
            decide(Some(&after), "b", Duration::ZERO, 15 * SEC),
            Decision::Acquire { previous: None }
        );
    }

    #[test]
    fn config_invariants() {
        let ok = LeaderConfig::new("ns", "lease", "me");
        assert!(ok.validate().is_ok());
        assert_eq!(ok.lease_duration_seconds(), 15);
        let timing = |l, r, p| {
            LeaderConfig::new("ns", "lease", "me")
                .with_timing(l, r, p)
                .validate()
        };
        assert!(matches!(
            timing(10 * SEC, 10 * SEC, SEC),
            Err(LeaderError::Config(_))
        ));
        assert!(matches!(
            timing(15 * SEC, 2 * SEC, 2 * SEC),
            Err(LeaderError::Config(_))
        ));
        assert!(matches!(
            timing(15 * SEC, 10 * SEC, Duration::ZERO),
            Err(LeaderError::Config(_))
        ));
        assert!(matches!(
            LeaderConfig::new("ns", "lease", "").validate(),
            Err(LeaderError::NoIdentity)
        ));
        assert!(matches!(
            LeaderConfig::new("", "lease", "me").validate(),
            Err(LeaderError::Config(_))
        ));
        let odd = ok.with_timing(Duration::from_millis(2500), 2 * SEC, SEC);
        assert_eq!(odd.lease_duration_seconds(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_flag_expires_at_the_deadline_by_itself() {
        let l = Leadership::new();
        let mut rx = l.subscribe();
        assert!(!l.is_leader());
        assert!(l.promote(Instant::now() + 2 * SEC));
        assert!(l.is_leader());
        assert!(*rx.borrow_and_update());
        tokio::time::advance(SEC).await;
        assert!(l.is_leader());
        tokio::time::advance(SEC).await;
        assert!(!l.is_leader(), "a stuck election task must not extend leadership");
        assert!(l.demote());
        assert!(!l.demote());
        assert!(rx.has_changed().unwrap());
        assert!(!*rx.borrow_and_update());
    }

    #[tokio::test]
    async fn fixed_leadership_does_not_run() {
        let yes = Leadership::fixed(true);
        assert!(yes.is_leader());
        assert!(*yes.subscribe().borrow());
        assert!(!Leadership::fixed(false).is_leader());
    }
}
