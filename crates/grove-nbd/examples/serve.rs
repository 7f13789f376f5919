//! Serves a pool over NBD until stdin closes: a manual test bench until
//! `grove serve` exists.
//!
//!   cargo run -p grove-nbd --example serve -- POOL_DIR SOCKET_PATH [DEFAULT_EXPORT]

use std::io::Read;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(pool_dir), Some(socket)) = (args.next(), args.next()) else {
        eprintln!("usage: serve POOL_DIR SOCKET_PATH [DEFAULT_EXPORT]");
        std::process::exit(2);
    };
    let pool = grove_store::Pool::open(pool_dir.as_ref())?;
    let options = grove_nbd::ServerOptions {
        default_export: args.next(),
        ..Default::default()
    };
    let server = grove_nbd::Server::new(pool, options);
    server.serve_unix(socket.as_ref())?;
    eprintln!("serving on {socket}; close stdin to stop");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    server.shutdown()?;
    Ok(())
}
