//! The Prometheus text exposition both daemons serve on `/metrics`.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::server::Encode;

/// The text exposition of every metric in `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The encoder the health and metrics server calls: `registry` of `metrics`, encoded.
pub fn encoder<M: Send + Sync + 'static>(metrics: Arc<M>, registry: fn(&M) -> &Registry) -> Encode {
    Arc::new(move || encode(registry(&metrics)))
}
