//! What the fuzz targets (`fuzz/`) feed arbitrary bytes to, and what the tests that replay their
//! corpus call: the coordinator's parsers of what it does not control. Each must neither panic
//! nor hang whatever it is given.

use crate::webhook;

/// An AdmissionReview the API server (or anyone who reaches the webhook) sends: parsed,
/// decided and answered, for a pod on a node and for none.
pub fn admission_review(data: &[u8]) {
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(request) = webhook::parse(&review) else {
        return;
    };
    for pod_node in [None, Some(None), Some(Some("node-a"))] {
        let verdict = webhook::decide(&request, pod_node);
        let answer = webhook::response(&request.uid, &verdict);
        assert_eq!(
            answer["response"]["allowed"].as_bool(),
            Some(verdict.is_ok())
        );
        assert_eq!(
            answer["response"]["uid"].as_str(),
            Some(request.uid.as_str())
        );
    }
}
