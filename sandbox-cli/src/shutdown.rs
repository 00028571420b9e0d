//! What the HTTP servers (`strata mcp --http`, `strata serve`) share: the accept loop of
//! HTTP/1 connections and the stop signal.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::Request;
use tokio_util::sync::CancellationToken;

/// Serves HTTP/1 connections accepted on `listener` with the service `make` returns for
/// each, until SIGINT or SIGTERM; then `stopped` is cancelled and every open connection
/// shuts down gracefully (its request in flight finishes). `name` prefixes log lines.
pub async fn serve_http1<S, B>(
    listener: tokio::net::TcpListener,
    name: &'static str,
    stopped: CancellationToken,
    make: impl Fn() -> S,
) where
    S: hyper::service::Service<Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stop = terminated();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("{name}: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small messages (stream events, unary answers) go out at once: without this,
        // Nagle's algorithm and the client's delayed ACK add ~40 ms to each exchange.
        if let Err(e) = stream.set_nodelay(true) {
            eprintln!("{name}: TCP_NODELAY: {e}");
        }
        let service = make();
        let stopped = stopped.clone();
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                // Upgrades (WebSocket) pass through `strata serve`'s port forwarding.
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
    stopped.cancel();
}

/// Resolves on SIGINT or SIGTERM.
pub async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let sigterm = async {
        match term.as_mut() {
            Some(term) => {
                term.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = sigterm => {}
    }
}
