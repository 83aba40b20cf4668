//! What the fuzz targets (`fuzz/`) feed arbitrary bytes to, and what the tests that replay their
//! corpus call: the agent's parsers of what it does not control. Each must neither panic nor
//! hang whatever it is given, and the probe responder must never answer with more than it got.

use std::{
    sync::{Mutex, OnceLock},
    time::Instant,
};

use crate::{
    config::Config,
    detect::{
        command::{Outcome, first_line},
        custom::{self, CustomCheckConfig},
        kernel_log::{self, KernelLogConfig, Pattern},
        peers::answer,
    },
};

/// The agent's configuration file.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::parse(text);
    }
}

/// `/dev/kmsg` records (one a line), through the default patterns.
pub fn kernel_log(data: &[u8]) {
    static PATTERNS: OnceLock<Vec<Pattern>> = OnceLock::new();
    let patterns = PATTERNS
        .get_or_init(|| kernel_log::compile(&KernelLogConfig::default()).unwrap_or_default());
    let seen = Mutex::default();
    let now = Instant::now();
    for record in String::from_utf8_lossy(data).split('\n') {
        if let Some(message) = kernel_log::message_of(record) {
            let _ = kernel_log::feed(patterns, &seen, message, now);
        }
    }
    let _ = kernel_log::evaluate(patterns, &seen, now);
}

/// A custom check's exit code (the first byte) and output (stdout, then after a NUL byte,
/// stderr), read by the node-problem-detector plugin protocol.
pub fn check_output(data: &[u8]) {
    let Some((code, output)) = data.split_first() else {
        return;
    };
    let (stdout, stderr) = match output.iter().position(|b| *b == 0) {
        Some(at) => (&output[..at], &output[at + 1..]),
        None => (output, &[][..]),
    };
    let check = CustomCheckConfig {
        name: "fuzz".into(),
        condition: "FuzzProblem".into(),
        reason: "Fuzzed".into(),
        command: vec!["/bin/true".into()],
        interval: std::time::Duration::from_secs(60),
        timeout: std::time::Duration::from_secs(30),
        hold: std::time::Duration::ZERO,
        max_output_length: 80,
        on_host: false,
        ..Default::default()
    };
    let outcome = Outcome {
        code: Some(i32::from(*code) - 1),
        first_line: first_line(stdout, stderr),
    };
    let finding = custom::evaluate(&check, Ok(outcome));
    assert!(
        finding.message.chars().count() <= nodeward_api::bounds::MESSAGE_LIMIT,
        "a finding's message stays within the report's bound"
    );
}

/// A peer probe (a UDP datagram or a TCP line): the answer is never longer than the probe.
pub fn probe(data: &[u8]) {
    if let Some(pong) = answer(data) {
        assert!(
            pong.len() <= data.len(),
            "answered {} bytes to a {}-byte probe",
            pong.len(),
            data.len()
        );
    }
}
