//! A Kafka client handle dropped on a thread of its own.

/// A Kafka client handle that is dropped on a thread of its own. Dropping a librdkafka handle
/// waits for its threads, and closing a consumer leaves its group; either can block for long
/// (rust-rdkafka #509, #611 — seen here after the broker restarted under a consumer), which must
/// hold neither a runtime thread nor a graceful shutdown. The close still runs; the process just
/// does not wait for it.
pub struct ClosesElsewhere<T: Send + 'static>(Option<T>);

/// A consumer closed on a thread of its own (see [`ClosesElsewhere`]).
pub type ClosingConsumer = ClosesElsewhere<super::ZConsumer>;

impl<T: Send + 'static> ClosesElsewhere<T> {
    pub fn new(client: T) -> Self {
        ClosesElsewhere(Some(client))
    }
}

impl<T: Send + 'static> std::ops::Deref for ClosesElsewhere<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: Send + 'static> Drop for ClosesElsewhere<T> {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            let spawned = std::thread::Builder::new()
                .name("kafka-close".into())
                .spawn(move || drop(c));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to close a Kafka client on; leaking it");
            }
        }
    }
}
