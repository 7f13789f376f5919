//! What the RADOS tests share: a fresh device name in the test pool of
//! scripts/ceph.sh's cluster, or a visible SKIP without one (a failure
//! under scripts/test.sh, which sets GROVE_REQUIRE_TOOLS), and a look at
//! the raw objects through librados.

#![allow(dead_code)]

use grove_rados::RadosTarget;

fn tools_required() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

/// A target no other test uses, or None after a visible SKIP.
pub fn fresh_target(test: &str) -> Option<RadosTarget> {
    let pool = std::env::var("GROVE_TEST_RADOS_POOL")
        .ok()
        .filter(|p| !p.is_empty());
    let conf = std::env::var_os("CEPH_CONF");
    match (pool, conf) {
        (Some(pool), Some(_)) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let name = format!("{test}-{}-{nanos}", std::process::id());
            Some(RadosTarget::from_env(&pool, &name).unwrap())
        }
        _ => {
            let why = "no Ceph cluster: CEPH_CONF or GROVE_TEST_RADOS_POOL is not set (scripts/ceph.sh start, then . the env file it prints)";
            assert!(
                !tools_required(),
                "{why}, and GROVE_REQUIRE_TOOLS is set (scripts/test.sh starts the cluster)"
            );
            eprintln!("SKIP: {why}");
            None
        }
    }
}

/// The sizes of a device's data objects 0..count (None: no such object),
/// read straight from RADOS with a connection of the test's own.
pub fn object_sizes(target: &RadosTarget, count: u64) -> Vec<Option<u64>> {
    let rados =
        ceph::ceph::connect_to_ceph(&target.client_id, &target.conf.to_string_lossy()).unwrap();
    let ioctx = rados.get_rados_ioctx(&target.pool).unwrap();
    let sizes = (0..count)
        .map(|i| {
            ioctx
                .rados_object_stat(&format!("{}.{i:016x}", target.name))
                .ok()
                .map(|(size, _)| size)
        })
        .collect();
    drop(ioctx);
    sizes
}
