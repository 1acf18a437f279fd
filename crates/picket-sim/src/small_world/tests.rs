use super::*;

#[test]
fn one_client_alone_explores_without_violation() {
    let bounds = Bounds { clients: 1, time_steps: 2, ..Bounds::default() };
    let exploration = explore(&bounds);
    assert!(exploration.complete);
    assert!(exploration.violation.is_none(), "{:?}", exploration.violation);
    assert!(exploration.states > 10, "{exploration:?}");
}
