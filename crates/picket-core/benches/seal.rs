//! What a signed sequencer costs: signing one at the lock service, verifying one at the
//! resource, and rendering an unsigned one for comparison: `cargo bench -p picket-core --bench
//! seal`. Figures are recorded in BENCHMARKS.md; nothing here asserts a timing.

use picket_core::{Sequencer, SequencerKeys, SequencerSigner};
use picket_testkit::bench::measure;
use std::hint::black_box;

fn main() {
    let signer = SequencerSigner::from_seed("picket", &[7; 32]).expect("a key");
    let spki = signer.public_key_spki();
    let keys = SequencerKeys::from_spki("picket", [spki.as_slice()]).expect("the public key");
    let mut token = 1_u64;
    measure("render an unsigned p1 sequencer", 20_000, || {
        token += 1;
        black_box(Sequencer::new("jobs/report", token).to_string());
    });
    measure("sign and render a p2 sequencer", 2_000, || {
        token += 1;
        black_box(signer.seal("jobs/report", token, 42).to_string());
    });
    let text = signer.seal("jobs/report", 99, 42).to_string();
    measure("parse and verify a p2 sequencer", 2_000, || {
        let parsed = Sequencer::parse(black_box(&text)).expect("parses");
        black_box(keys.verify(&parsed)).expect("verifies");
    });
}
