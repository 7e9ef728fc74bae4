//! SPDY/3.1 as the apiserver (or anyone who reaches the kubelet port) sends it: every frame of
//! the input decoded in order, header blocks inflated with one receiving context as a
//! connection reads them (`kubelet::spdy::decode`). No input panics; what decodes encodes back
//! to the same frame, and decoded headers survive our own compression.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use virtual_node_eci::kubelet::spdy::headers::{Deflater, Inflater};
use virtual_node_eci::kubelet::spdy::{self, frame};

fuzz_target!(|data: &[u8]| {
    let Ok(frames) = spdy::decode(data) else {
        return;
    };
    let mut deflater = Deflater::default();
    let mut inflater = Inflater::default();
    for (decoded, headers) in frames {
        let mut out = BytesMut::new();
        frame::encode(&decoded, &mut out).expect("a decoded frame encodes");
        let (again, used) = frame::decode_one(&out)
            .expect("a re-encoded frame decodes")
            .expect("a re-encoded frame is whole");
        assert_eq!(used, out.len());
        assert_eq!(again, decoded);
        if let Some(headers) = headers {
            let block = deflater
                .headers(&headers)
                .expect("decoded headers compress");
            let read = inflater.headers(&block).expect("our block inflates");
            assert_eq!(read, headers);
        }
    }
});
