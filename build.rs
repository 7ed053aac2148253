//! Build script: sets the SONAME of the shared library, writes the pkg-config file and
//! regenerates `include/tolk.h` from `src/capi/`  with cbindgen (the header is committed;
//! CI fails when the committed copy drifts from what this generates).
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let version = env::var("CARGO_PKG_VERSION").unwrap();
    let major = version.split('.').next().unwrap_or("0");

    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtolk.so.{major}");
    }

    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");

    let header = manifest_dir.join("include").join("tolk.h");
    let config = cbindgen::Config::from_file(manifest_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is valid");
    match cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest_dir.join("src").join("capi").join("mod.rs"))
        .generate()
    {
        Ok(bindings) => {
            bindings.write_to_file(&header);
        }
        Err(err) => panic!("cbindgen failed to generate include/tolk.h: {err}"),
    }

    // pkg-config file next to the built library (target/<profile>/tolk.pc).
    if let Ok(out_dir) = env::var("OUT_DIR") {
        // OUT_DIR = target/<profile>/build/tolk-<hash>/out
        let profile_dir = PathBuf::from(out_dir).ancestors().nth(3).map(PathBuf::from);
        if let Some(dir) = profile_dir {
            let pc = format!(
                "prefix={prefix}\nlibdir=${{prefix}}/target/{profile}\nincludedir=${{prefix}}/include\n\n\
                 Name: tolk\nDescription: Embeddable neural machine translation inference\n\
                 Version: {version}\nLibs: -L${{libdir}} -ltolk\nLibs.private: -lpthread -ldl -lm\n\
                 Cflags: -I${{includedir}}\n",
                prefix = manifest_dir.display(),
                profile = env::var("PROFILE").unwrap_or_else(|_| "release".into()),
            );
            let _ = fs::write(dir.join("tolk.pc"), pc);
        }
    }
}
