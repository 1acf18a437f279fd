//! Deliberate bugs for the fault harness's mutation tests (`picket chaos run --mutation`),
//! switched on by the `PICKET_MUTATION` environment variable. Compiled only with the
//! `mutations` feature, which only the picket crate's dev-dependencies enable: a binary built
//! without its tests (`cargo build --release -p picket`, `cargo install`) cannot have them.

/// Whether the mutation `name` is switched on for this process.
pub(crate) fn is_on(name: &str) -> bool {
    let on = std::env::var("PICKET_MUTATION").is_ok_and(|value| value == name);
    if on {
        tracing::warn!(mutation = name, "a deliberate bug is switched on (PICKET_MUTATION)");
    }
    on
}
