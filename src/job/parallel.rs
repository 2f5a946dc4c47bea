//! Data parallel: several engines (one per GPU, several on one GPU, or several CPU engines) behind
//! the one [`Generate`] the job loop drives, so one runner, one checkpoint and one output serve
//! them all.
//!
//! Each engine is built and driven inside its own thread (the CUDA state is not `Send`): the
//! pool hands each thread a factory, and requests and results cross threads as plain data
//! ([`GenRequest`], [`Finished`]). The runner's thread routes each request
//! ([`super::routing::PrefixRouter`]) into a per-engine queue; a worker tops its engine up from
//! its own queue (to twice its slots) and, when its queue is empty, steals from the others to
//! keep its running slots busy. Results come back over one channel in the order engines
//! finish them; the checkpoint writes the output in input order, as with one engine.
//!
//! Rows do not depend on the engine that ran them: sampling is seeded per request and the CPU
//! backend's per-sequence results do not depend on the batch, so N engines write the bytes one
//! engine writes (tests/data_parallel.rs).

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Map, Value};

use super::routing::{PrefixRouter, DEFAULT_MAX_BLOCKS};
use super::runner::{Finished, GenRequest, Generate, StopFlag};

/// Builds one engine; called inside the engine's own thread.
pub type EngineFactory = Box<dyn FnOnce() -> anyhow::Result<Box<dyn Generate>> + Send>;

/// One engine of the pool: a name for logs and the report (`cuda:0`, `cpu#1`) and its factory.
pub struct EngineSpec {
    pub label: String,
    pub make: EngineFactory,
}

/// How often a waiting thread looks at the stop flag and at dead workers.
const TICK: Duration = Duration::from_millis(50);

struct State {
    router: PrefixRouter,
    shutdown: bool,
    /// Each engine's latest `metrics_json`, refreshed after every poll.
    metrics: Vec<Option<Value>>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a request is queued and at shutdown.
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked while holding the lock left the router consistent (every
        // mutation is a few field updates); the pool reports the dead thread itself.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum Msg {
    Ready { capacity: usize, slots: usize },
    Done { finished: Vec<Finished> },
    Failed { engine: usize, error: anyhow::Error },
}

pub struct EnginePool {
    shared: Arc<Shared>,
    results: Receiver<Msg>,
    threads: Vec<JoinHandle<()>>,
    labels: Vec<String>,
    capacity: usize,
    slots: usize,
    /// Submitted and not yet returned by `poll`.
    outstanding: usize,
    stop: StopFlag,
}

impl EnginePool {
    /// Starts one thread per spec, builds the engines there (concurrently) and waits until all
    /// are ready. `block`: the KV block size (prefix routing works on whole blocks). An engine
    /// that fails to build fails the pool, naming it.
    pub fn start(specs: Vec<EngineSpec>, block: usize, stop: StopFlag) -> anyhow::Result<Self> {
        anyhow::ensure!(!specs.is_empty(), "internal: an engine pool needs at least one engine");
        let n = specs.len();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                router: PrefixRouter::new(n, block, DEFAULT_MAX_BLOCKS),
                shutdown: false,
                metrics: vec![None; n],
            }),
            work: Condvar::new(),
        });
        let (tx, results) = mpsc::channel();
        let mut labels = Vec::with_capacity(n);
        let mut pool = EnginePool {
            shared: shared.clone(),
            results,
            threads: Vec::with_capacity(n),
            labels: Vec::new(),
            capacity: 0,
            slots: 0,
            outstanding: 0,
            stop: stop.clone(),
        };
        for (i, spec) in specs.into_iter().enumerate() {
            labels.push(spec.label.clone());
            let (shared, tx, stop) = (shared.clone(), tx.clone(), stop.clone());
            let t = std::thread::Builder::new()
                .name(format!("engine-{i}"))
                .spawn(move || worker(i, spec.make, &shared, &tx, &stop))
                .with_context(|| format!("starting the thread of engine {i} ({})", spec.label))?;
            pool.threads.push(t);
        }
        pool.labels = labels;
        drop(tx);
        let mut ready = 0;
        while ready < n {
            match pool.next_msg()? {
                None => {}
                Some(Msg::Ready { capacity, slots }) => {
                    pool.capacity += capacity;
                    pool.slots += slots;
                    ready += 1;
                }
                Some(Msg::Failed { engine, error }) => {
                    return Err(error.context(format!("building engine {engine} ({})", pool.labels[engine])))
                }
                Some(Msg::Done { .. }) => {}
            }
        }
        Ok(pool)
    }

    pub fn engines(&self) -> usize {
        self.labels.len()
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Running slots of all engines together.
    pub fn total_slots(&self) -> usize {
        self.slots
    }

    /// The next message, or `None` after a quiet [`TICK`]. A worker thread that ended without
    /// a message panicked: a failing worker sends `Failed` before its thread ends, so once a
    /// thread is seen finished, its message (if any) is already in the channel.
    fn next_msg(&self) -> anyhow::Result<Option<Msg>> {
        match self.results.recv_timeout(TICK) {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => match self.threads.iter().position(JoinHandle::is_finished) {
                None => Ok(None),
                Some(i) => match self.results.try_recv() {
                    Ok(m) => Ok(Some(m)),
                    Err(_) => {
                        anyhow::bail!("engine {i} ({}) stopped unexpectedly (its thread panicked)", self.labels[i])
                    }
                },
            },
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("every engine thread has ended"),
        }
    }
}

impl Generate for EnginePool {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn submit(&mut self, req: GenRequest) -> anyhow::Result<()> {
        self.shared.lock().router.route(req);
        self.outstanding += 1;
        // Every worker: the routed engine, or one whose queue ran dry and may steal it.
        self.shared.work.notify_all();
        Ok(())
    }

    fn poll(&mut self) -> anyhow::Result<Vec<Finished>> {
        if self.outstanding == 0 {
            return Ok(Vec::new());
        }
        loop {
            let Some(first) = self.next_msg()? else {
                if self.stop.is_set() {
                    return Ok(Vec::new());
                }
                continue;
            };
            // Whatever else has arrived comes along, so the runner commits in larger batches.
            let mut out = Vec::new();
            for m in std::iter::once(first).chain(std::iter::from_fn(|| self.results.try_recv().ok())) {
                match m {
                    Msg::Done { finished } => out.extend(finished),
                    Msg::Failed { engine, error } => {
                        return Err(error.context(format!("engine {engine} ({})", self.labels[engine])))
                    }
                    Msg::Ready { .. } => {}
                }
            }
            self.outstanding = self.outstanding.saturating_sub(out.len());
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }

    /// The sum over the engines (see [`merge_metrics`]) with `engines`: each engine's own
    /// metrics, its device label and its routing counts.
    fn metrics_json(&self) -> Option<Value> {
        let st = self.shared.lock();
        let mut per = Vec::with_capacity(self.engines());
        for (i, label) in self.labels.iter().enumerate() {
            let mut m = match &st.metrics[i] {
                Some(Value::Object(m)) => m.clone(),
                _ => Map::new(),
            };
            m.insert("engine".into(), i.into());
            m.insert("device".into(), label.clone().into());
            m.insert("routing".into(), serde_json::to_value(st.router.stats(i)).unwrap_or_default());
            per.push(Value::Object(m));
        }
        let mut total = merge_metrics(&per);
        if let Value::Object(t) = &mut total {
            t.remove("engine");
            t.remove("device");
            t.insert("engine_count".into(), per.len().into());
            t.insert("engines".into(), Value::Array(per));
        }
        Some(total)
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            // A worker finishes the engine step it is in (between steps when the job's stop
            // flag is set), then sees the shutdown.
            let _ = t.join();
        }
    }
}

/// One engine's thread: build the engine, then take requests, step, hand back results, until
/// shutdown. Errors go to the pool as `Failed` (a whole-job failure, as with one engine).
fn worker(i: usize, make: EngineFactory, shared: &Shared, tx: &Sender<Msg>, stop: &StopFlag) {
    let mut gen = match make() {
        Ok(g) => g,
        Err(error) => {
            let _ = tx.send(Msg::Failed { engine: i, error });
            return;
        }
    };
    let (capacity, slots) = (gen.capacity().max(1), gen.slots().clamp(1, gen.capacity().max(1)));
    if tx.send(Msg::Ready { capacity, slots }).is_err() {
        return;
    }
    shared.lock().metrics[i] = gen.metrics_json();
    if let Err(error) = drive(i, gen.as_mut(), capacity, slots, shared, tx, stop) {
        let _ = tx.send(Msg::Failed { engine: i, error });
    }
}

fn drive(
    i: usize,
    gen: &mut dyn Generate,
    capacity: usize,
    slots: usize,
    shared: &Shared,
    tx: &Sender<Msg>,
    stop: &StopFlag,
) -> anyhow::Result<()> {
    // Requests an engine holds at most: its slots and as many waiting. The engine's own queue
    // could hold more, but what it holds cannot be stolen, and the worker refills the engine as
    // soon as a request finishes anyway; so the rest waits in the pool's queues, where an idle
    // engine can take it (this keeps the tail of a job spread over the engines).
    let hold = (2 * slots).min(capacity);
    let mut running = 0usize;
    loop {
        let batch = {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    return Ok(());
                }
                // After a stop the job drops in-flight requests: take nothing, wait for shutdown.
                if !stop.is_set() {
                    let b = st.router.take(i, hold.saturating_sub(running), slots.saturating_sub(running));
                    if !b.is_empty() || running > 0 {
                        break b;
                    }
                }
                st = shared.work.wait_timeout(st, TICK).map_err(|_| anyhow::anyhow!("engine lock poisoned"))?.0;
            }
        };
        running += batch.len();
        for req in batch {
            gen.submit(req).context("submitting a request to the engine")?;
        }
        let finished = gen.poll().context("running the model")?;
        if finished.is_empty() && !stop.is_set() {
            anyhow::bail!("internal: the engine holds {running} unfinished requests but has no work");
        }
        running -= finished.len().min(running);
        {
            let mut st = shared.lock();
            st.router.finished(i, finished.len());
            st.metrics[i] = gen.metrics_json();
        }
        if !finished.is_empty() && tx.send(Msg::Done { finished }).is_err() {
            return Ok(());
        }
    }
}

/// Keys whose total over engines is the largest value, not the sum (a block size, a quantile).
fn is_max_key(k: &str) -> bool {
    k == "kv_block_size" || k.ends_with("_median") || k.ends_with("_p99")
}

/// Keys whose total is the mean over engines (a share).
fn is_mean_key(k: &str) -> bool {
    k == "slot_occupancy" || k == "share" || k.ends_with("_per_step")
}

/// Sums engine metrics key by key (objects recursively): counters add up (`kv_blocks_peak`
/// becomes the sum of the engines' peaks, `avg_running` the mean sequences running across
/// engines), block sizes and latency quantiles take the largest engine's value, shares the
/// mean; other values are the first engine's.
pub fn merge_metrics(all: &[Value]) -> Value {
    merge_at("", all)
}

fn merge_at(key: &str, all: &[Value]) -> Value {
    let Some(first) = all.first() else { return Value::Null };
    match first {
        Value::Object(m) => {
            let mut out = Map::new();
            for k in m.keys() {
                let vals: Vec<Value> = all.iter().filter_map(|v| v.get(k).cloned()).collect();
                out.insert(k.clone(), merge_at(k, &vals));
            }
            Value::Object(out)
        }
        Value::Number(_) => {
            let nums: Vec<&serde_json::Number> = all.iter().filter_map(Value::as_number).collect();
            if is_max_key(key) {
                let m = nums.iter().filter_map(|n| n.as_f64()).fold(f64::MIN, f64::max);
                return number_like(first, m);
            }
            if is_mean_key(key) {
                let s: f64 = nums.iter().filter_map(|n| n.as_f64()).sum();
                return serde_json::Number::from_f64(s / nums.len().max(1) as f64).map_or(Value::Null, Value::Number);
            }
            if nums.iter().all(|n| n.is_u64()) {
                return nums.iter().filter_map(|n| n.as_u64()).sum::<u64>().into();
            }
            number_like(first, nums.iter().filter_map(|n| n.as_f64()).sum())
        }
        other => other.clone(),
    }
}

/// `x` as an integer when `like` is one, else as a float.
fn number_like(like: &Value, x: f64) -> Value {
    if like.is_u64() && x >= 0.0 {
        (x as u64).into()
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metrics_sum_counters_and_keep_quantiles_and_shares_apart() {
        let a = json!({"prompt_tokens": 10, "avg_running": 1.5, "slot_occupancy": 0.5, "kv_block_size": 16,
            "constraint": {"masks": 3, "mask_us_p99": 40.0}, "name": "x"});
        let b = json!({"prompt_tokens": 5, "avg_running": 2.0, "slot_occupancy": 1.0, "kv_block_size": 16,
            "constraint": {"masks": 4, "mask_us_p99": 10.0}, "name": "y"});
        let m = merge_metrics(&[a, b]);
        assert_eq!(m["prompt_tokens"], 15);
        assert_eq!(m["avg_running"], 3.5);
        assert_eq!(m["slot_occupancy"], 0.75);
        assert_eq!(m["kv_block_size"], 16);
        assert_eq!(m["constraint"], json!({"masks": 7, "mask_us_p99": 40.0}));
        assert_eq!(m["name"], "x");
        assert_eq!(merge_metrics(&[]), Value::Null);
    }
}
