//! The workspace's binaries (central-outbox, site-forwarder, outboxctl, smtp-sink), built from
//! the current sources for whatever starts them as processes: the end-to-end tests and the bench.
//!
//! Cargo builds only what the command it runs needs. `cargo test` builds a package's binaries
//! only for that package's own integration tests (and `CARGO_BIN_EXE_<name>` names only those),
//! and `cargo run --bin bench` builds the bench alone. Whatever else sits in the target directory
//! may be missing (a fresh clone) or older than the sources (an edit since the last build), and
//! a test would then pass, or a figure be measured, against code that no longer exists. So
//! [`build`] runs `cargo build --workspace --bins` into the target directory and profile the
//! caller was built for, reusing what built the caller; when nothing changed, that costs cargo's
//! freshness check (0.15 s measured after `cargo test --workspace`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

/// The cargo command that built the caller, whose profile and dependency features the build
/// of the binaries repeats so that it reuses what that command compiled. With other settings
/// cargo compiles a second copy of the crates they touch and of everything downstream (seen: the
/// `dev` profile instead of `test` rebuilds ring, rustls, tonic and every crate of ours; leaving
/// out the dev-dependencies' features, regex-syntax's `std`, rebuilds tracing-subscriber and
/// every crate of ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltBy {
    /// `cargo test`: the `test` profile (in `debug/`), features unified with every member's
    /// dev-dependencies.
    CargoTest,
    /// `cargo build` or `cargo run`: the `dev` profile (in `debug/`), without dev-dependencies.
    CargoBuild,
}

/// Builds every binary of the workspace with the cargo that runs the caller (`$CARGO`, set by
/// `cargo test` and `cargo run`; else `cargo` on the PATH), for `profile_dir`, the directory the
/// caller's own binaries are put in (`<target_dir>[/<triple>]/<profile>`), and returns it: the
/// fresh binaries are there. Cargo's output goes to stderr as it comes (what was rebuilt, or why
/// the build failed).
pub fn build(target_dir: &Path, profile_dir: &Path, built_by: BuiltBy) -> Result<PathBuf> {
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        // Cargo puts the `dev` and `test` profiles' output in `debug`, every other profile's
        // (`cargo test --release` uses `release`) in a directory of its name.
        Some("debug") if built_by == BuiltBy::CargoTest => "test",
        Some("debug") => "dev",
        Some(name) => name,
        None => bail!("{} names no cargo profile", profile_dir.display()),
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow!("the tests crate lies in no workspace"))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args(["--workspace", "--bins", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir);
    if built_by == BuiltBy::CargoTest {
        // Asking for examples (there are none) is what makes a build resolve features with
        // the dev-dependencies, as `cargo test` does, without building any test.
        command.arg("--examples");
    }
    // Built for another target than the host (`cargo test --target <triple>`): the triple is
    // the directory between the target directory and the profile's.
    if let Some(triple_dir) = profile_dir.parent().filter(|dir| *dir != target_dir) {
        command.arg("--target").arg(
            triple_dir
                .file_name()
                .ok_or_else(|| anyhow!("{} names no target", triple_dir.display()))?,
        );
    }
    // Cargo gives the running test (or `cargo run` binary) the variables it gives a crate being
    // compiled, which this build would pass on to build scripts. Some scripts rerun when one
    // changes (ring's watches CARGO_MANIFEST_DIR and CARGO_PKG_NAME), and a rerun of ring's
    // rebuilds rustls, tonic and every crate of ours: so the build runs without them, in the
    // environment the command that built the caller had.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_a_crate) {
            command.env_remove(name);
        }
    }
    let status = command
        .status()
        .with_context(|| format!("cannot run {}", cargo.to_string_lossy()))?;
    if !status.success() {
        bail!(
            "building the workspace's binaries failed ({status}; cargo's output is above): \
             {command:?}"
        );
    }
    Ok(profile_dir.to_path_buf())
}

/// Whether `name` is one of the variables cargo sets for a crate it compiles or runs (the
/// Cargo Book's "Environment variables Cargo sets for crates"), and not the user's own cargo
/// configuration (CARGO_HOME, CARGO_TARGET_DIR, CARGO_BUILD_*, ...), which the build must keep.
fn set_by_cargo_for_a_crate(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_a_crate;

    #[test]
    fn only_what_cargo_sets_for_a_crate_is_left_out() {
        for set in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_smtp-sink",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_a_crate(set), "{set}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_for_a_crate(kept), "{kept}");
        }
    }
}
