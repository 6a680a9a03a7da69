//! DNS discovery: one thread per `discovery` table resolves its name every `every` and hands
//! the addresses to [`LiveBackends::apply_discovered`] (each address a backend slot of its
//! own; addresses gone drain). A Kubernetes headless Service answers with one A record per
//! ready pod, which is how abe follows a Deployment without a Kubernetes client.
//!
//! Resolution is blocking (`getaddrinfo`, which reads `/etc/hosts` and asks the system's
//! DNS), so it runs here, never on the engine or an io thread. A name that does not exist
//! (the Service has no ready pod) means no address: every slot drains. Any other failure (a
//! DNS server that does not answer) keeps the slots as they are: a resolver outage must not
//! empty the router. The resolver is a trait so a test can answer without DNS.

use super::LiveBackends;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a sleeping discovery thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Turns a name and port into addresses.
pub trait Resolve: Send + Sync {
    /// `Ok(vec![])` when the name does not exist; `Err` when the answer is unknown.
    fn resolve(&self, dns: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The system resolver (`getaddrinfo`: `/etc/hosts`, then DNS).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, dns: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        match (dns, port).to_socket_addrs() {
            Ok(addrs) => Ok(addrs.collect()),
            Err(e) if name_does_not_exist(&e) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// glibc's and musl's texts for EAI_NONAME / EAI_NODATA, which std passes on only as text.
fn name_does_not_exist(e: &io::Error) -> bool {
    let text = e.to_string();
    [
        "not known",
        "No address associated",
        "does not resolve",
        "not found",
    ]
    .iter()
    .any(|t| text.contains(t))
}

/// The running discovery threads.
pub struct DiscoveryThreads {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DiscoveryThreads {
    /// One thread per discovery table of `live`, resolving through `resolver`; the first
    /// round runs at once.
    pub fn spawn(
        live: Arc<LiveBackends>,
        resolver: Arc<dyn Resolve>,
    ) -> io::Result<DiscoveryThreads> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(live.plans().len());
        for p in 0..live.plans().len() {
            let (l, r, s) = (live.clone(), resolver.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("abe-discovery-{p}"))
                .spawn(move || follow(&l, p, &*r, &s));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    DiscoveryThreads { stop, threads }.stop();
                    return Err(e);
                }
            }
        }
        Ok(DiscoveryThreads { stop, threads })
    }

    /// Stops and joins every thread (each within one poll, or one resolution).
    pub fn stop(self) {
        // Release: nothing to publish but the flag; Acquire on the reader's side for form.
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Resolves plan `p`'s name every `every` until `stop`.
fn follow(live: &LiveBackends, p: usize, resolver: &dyn Resolve, stop: &AtomicBool) {
    let d = live.plans()[p].discovery.clone();
    let every = Duration::from_millis(d.every);
    while !stop.load(Ordering::Acquire) {
        let round = Instant::now();
        match resolver.resolve(&d.dns, d.port) {
            Ok(mut addrs) => {
                addrs.sort();
                addrs.dedup();
                let changed = live.apply_discovered(p, &addrs);
                if changed > 0 {
                    tracing::info!(dns = %d.dns, addresses = addrs.len(), changed,
                        "discovery: backends changed");
                }
            }
            Err(e) => tracing::warn!(dns = %d.dns, error = %e,
                "discovery: cannot resolve; keeping the backends as they are"),
        }
        while !stop.load(Ordering::Acquire) {
            let left = every.saturating_sub(round.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(STOP_POLL));
        }
    }
}
