use super::*;
use proptest::prelude::*;

/// What feeding some pieces produced.
#[derive(Debug)]
struct Outcome {
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    done: bool,
    rest: BytesMut,
}

/// Feeds the pieces one after another into one buffer, decoding after each until the
/// decoder needs more, as the client does after each read.
fn feed(pieces: &[&[u8]]) -> Result<Outcome, ChunkedError> {
    let mut decoder = ChunkedDecoder::new();
    let mut buf = BytesMut::new();
    let mut out = Outcome {
        data: Vec::new(),
        trailers: None,
        done: false,
        rest: BytesMut::new(),
    };
    for piece in pieces {
        buf.extend_from_slice(piece);
        // Every answer but NeedMore consumes at least a byte or ends the body, so more calls
        // than that mean the decoder went round without progress.
        let budget = buf.len() + 2;
        for calls in 0.. {
            assert!(calls <= budget, "no progress");
            if out.done {
                break;
            }
            match decoder.decode(&mut buf)? {
                Decoded::Data(d) => {
                    assert!(!d.is_empty(), "empty Data");
                    out.data.extend_from_slice(&d);
                }
                Decoded::Trailers(t) => {
                    out.trailers = Some(t);
                    out.done = true;
                }
                Decoded::End => out.done = true,
                Decoded::NeedMore => break,
            }
        }
    }
    if out.done {
        assert!(decoder.is_done());
        let before = buf.clone();
        assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::End)));
        assert_eq!(buf, before, "a call after the end consumed bytes");
    } else {
        assert!(!decoder.is_done());
    }
    out.rest = buf;
    Ok(out)
}

fn whole(input: &[u8]) -> Result<Outcome, ChunkedError> {
    feed(&[input])
}

fn error_of(input: &[u8]) -> &'static str {
    match whole(input) {
        Err(e) => e.0,
        Ok(out) => panic!("no error for {:?}: {out:?}", String::from_utf8_lossy(input)),
    }
}

#[test]
fn a_simple_body() {
    let out = whole(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").unwrap();
    assert_eq!(out.data, b"hello world");
    assert!(out.done);
    assert!(out.trailers.is_none());
    assert!(out.rest.is_empty());
}

#[test]
fn extensions_are_ignored() {
    let input =
        b"5;name=value\r\nhello\r\n6 ; a ;b = \"q;\\\"x\\\\\" ;c=d \r\n world\r\n0;last\r\n\r\n";
    let out = whole(input).unwrap();
    assert_eq!(out.data, b"hello world");
    assert!(out.done);
}

#[test]
fn hex_digits_of_either_case() {
    let data: Vec<u8> = (0..0xab).map(|i| i as u8).collect();
    for size in ["AB", "ab", "aB", "00Ab"] {
        let mut input = format!("{size}\r\n").into_bytes();
        input.extend_from_slice(&data);
        input.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(whole(&input).unwrap().data, data, "{size}");
    }
}

#[test]
fn the_last_chunk_without_trailers_is_the_end() {
    let out = whole(b"0\r\n\r\n").unwrap();
    assert!(out.done);
    assert!(out.data.is_empty());
    assert!(out.trailers.is_none());
}

#[test]
fn trailers_after_the_last_chunk() {
    let out = whole(b"3\r\nabc\r\n0\r\nExpires: never\r\nX-Sum:\t abc \r\n\r\n").unwrap();
    assert_eq!(out.data, b"abc");
    let trailers = out.trailers.unwrap();
    assert_eq!(trailers.len(), 2);
    assert_eq!(trailers["expires"], "never");
    assert_eq!(trailers["x-sum"], "abc");
}

#[test]
fn a_repeated_trailer_keeps_both_values() {
    let out = whole(b"0\r\nA: 1\r\na: 2\r\nEmpty:\r\n\r\n").unwrap();
    let trailers = out.trailers.unwrap();
    let all: Vec<_> = trailers.get_all("a").iter().collect();
    assert_eq!(all, ["1", "2"]);
    assert_eq!(trailers["empty"], "");
}

#[test]
fn any_split_decodes_the_same() {
    let input: &[u8] =
        b"5;x=\"a b\"\r\nhello\r\nA\r\n, world!!!\r\n1\r\n.\r\n0\r\nA: 1\r\nB: two\r\n\r\n";
    let check = |out: Outcome| {
        assert_eq!(out.data, b"hello, world!!!.");
        let trailers = out.trailers.unwrap();
        assert_eq!(trailers["a"], "1");
        assert_eq!(trailers["b"], "two");
        assert!(out.rest.is_empty());
    };
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    check(feed(&bytes).unwrap());
    for at in 0..=input.len() {
        let (a, b) = input.split_at(at);
        check(feed(&[a, b]).unwrap());
    }
}

#[test]
fn part_of_a_chunk_is_given_out_at_once() {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let mut decoder = ChunkedDecoder::new();
    let mut buf = BytesMut::from(&b"2710\r\n"[..]);
    buf.extend_from_slice(&data[..3000]);
    match decoder.decode(&mut buf).unwrap() {
        Decoded::Data(d) => assert_eq!(d, data[..3000]),
        other => panic!("{other:?}"),
    }
    assert!(buf.is_empty());
    assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::NeedMore)));
    buf.extend_from_slice(&data[3000..]);
    buf.extend_from_slice(b"\r");
    match decoder.decode(&mut buf).unwrap() {
        Decoded::Data(d) => assert_eq!(d, data[3000..]),
        other => panic!("{other:?}"),
    }
    assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::NeedMore)));
    buf.extend_from_slice(b"\n0\r\n\r\n");
    assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::End)));
    assert!(decoder.is_done());
}

#[test]
fn an_empty_size_is_an_error() {
    assert_eq!(error_of(b"\r\n"), "invalid chunk size line");
    assert_eq!(error_of(b";a=b\r\n"), "invalid chunk size line");
    assert_eq!(
        error_of(b" 5\r\nhello\r\n0\r\n\r\n"),
        "invalid chunk size line"
    );
}

#[test]
fn a_size_that_is_not_hex_is_an_error() {
    for input in [
        &b"g\r\n"[..],
        b"5g\r\nhello\r\n",
        b"0x5\r\nhello\r\n",
        b"+5\r\nhello\r\n",
        b"-1\r\n",
        b"5 5\r\nhello\r\n",
        b"5\r\r\nhello\r\n",
    ] {
        assert_eq!(
            error_of(input),
            "invalid chunk size line",
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn malformed_extensions_are_an_error() {
    for input in [
        &b"5;\r\n"[..],
        b"5;=v\r\n",
        b"5;a=\r\n",
        b"5;a=\"unterminated\r\n",
        b"5;a=\"bad\\\"\r\n",
        b"5;a b\r\n",
        b"5;a=b\"c\"\r\n",
        b"5;a=\"\x01\"\r\n",
    ] {
        assert_eq!(
            error_of(input),
            "invalid chunk size line",
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn a_size_beyond_u64_is_an_error() {
    assert_eq!(error_of(b"10000000000000000\r\n"), "chunk size too large");
    // The largest size is fine (the body is just not all there yet) and so are leading zeros.
    let out = whole(b"ffffffffffffffff\r\nabc").unwrap();
    assert_eq!(out.data, b"abc");
    assert!(!out.done);
    let out = whole(b"000000000000000000000003\r\nabc\r\n0\r\n\r\n").unwrap();
    assert_eq!(out.data, b"abc");
}

#[test]
fn a_size_line_too_long_is_an_error_even_unfinished() {
    let line = |len: usize| {
        let mut l = b"3;a=".to_vec();
        l.resize(len, b'x');
        l
    };
    let mut longest = line(MAX_SIZE_LINE);
    longest.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n");
    assert_eq!(whole(&longest).unwrap().data, b"abc");

    let mut too_long = line(MAX_SIZE_LINE + 1);
    too_long.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n");
    assert_eq!(error_of(&too_long), "chunk size line too long");
    // Without its line end: an error once the limit is passed, not a wait for more.
    let unfinished = line(MAX_SIZE_LINE + 2);
    assert_eq!(error_of(&unfinished), "chunk size line too long");
    let bytes: Vec<&[u8]> = unfinished.chunks(1).collect();
    assert_eq!(feed(&bytes).unwrap_err().0, "chunk size line too long");
}

#[test]
fn a_bare_lf_is_an_error() {
    assert_eq!(error_of(b"5\nhello\r\n0\r\n\r\n"), "line not ended by crlf");
    assert_eq!(error_of(b"\n"), "line not ended by crlf");
    assert_eq!(error_of(b"5\r\nhello\r\n0\n\r\n"), "line not ended by crlf");
    assert_eq!(error_of(b"0\r\nA: 1\n\r\n"), "line not ended by crlf");
    assert_eq!(error_of(b"0\r\nA: 1\r\n\n"), "line not ended by crlf");
    assert_eq!(error_of(b"0\r\n\n"), "line not ended by crlf");
}

#[test]
fn chunk_data_not_followed_by_crlf_is_an_error() {
    assert_eq!(
        error_of(b"5\r\nhello\n0\r\n\r\n"),
        "missing crlf after chunk data"
    );
    assert_eq!(
        error_of(b"5\r\nhelloX\r\n"),
        "missing crlf after chunk data"
    );
    assert_eq!(error_of(b"5\r\nhello\rX"), "missing crlf after chunk data");
    // One byte early: the size was a lie.
    assert_eq!(
        error_of(b"5\r\nhell\r\n0\r\n\r\n"),
        "missing crlf after chunk data"
    );
}

#[test]
fn malformed_trailer_fields_are_an_error() {
    for input in [
        &b"0\r\nno colon\r\n\r\n"[..],
        b"0\r\n: no name\r\n\r\n",
        b"0\r\nbad name: x\r\n\r\n",
        b"0\r\nName : x\r\n\r\n",
        b"0\r\nA: 1\r\n folded\r\n\r\n",
        b"0\r\nA: \x01\r\n\r\n",
        b"0\r\nA: x\ry\r\n\r\n",
    ] {
        assert_eq!(
            error_of(input),
            "invalid trailer field",
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn too_many_trailer_fields_are_an_error() {
    let section = |fields: usize| {
        let mut s = b"0\r\n".to_vec();
        for i in 0..fields {
            s.extend_from_slice(format!("f{i}: v\r\n").as_bytes());
        }
        s.extend_from_slice(b"\r\n");
        s
    };
    let out = whole(&section(MAX_TRAILER_FIELDS)).unwrap();
    assert_eq!(out.trailers.unwrap().len(), MAX_TRAILER_FIELDS);
    assert_eq!(
        error_of(&section(MAX_TRAILER_FIELDS + 1)),
        "too many trailer fields"
    );
}

#[test]
fn a_trailer_section_too_large_is_an_error() {
    // One field filling the section to exactly the limit, its final empty line included.
    let section = |total: usize| {
        let mut s = b"0\r\nbig: ".to_vec();
        s.resize(3 + total - 4, b'x');
        s.extend_from_slice(b"\r\n\r\n");
        s
    };
    let out = whole(&section(MAX_TRAILER_BYTES)).unwrap();
    assert!(out.trailers.is_some());
    assert_eq!(
        error_of(&section(MAX_TRAILER_BYTES + 1)),
        "trailer section too large"
    );
    // Never ended: an error once past the limit.
    let mut unfinished = b"0\r\nbig: ".to_vec();
    unfinished.resize(3 + MAX_TRAILER_BYTES, b'x');
    assert_eq!(error_of(&unfinished), "trailer section too large");
}

#[test]
fn an_error_stays_an_error() {
    let mut decoder = ChunkedDecoder::new();
    let mut buf = BytesMut::from(&b"z\r\n5\r\nhello\r\n0\r\n\r\n"[..]);
    let first = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(first.to_string(), "invalid chunk size line");
    assert_eq!(decoder.decode(&mut buf).unwrap_err(), first);
    assert!(!decoder.is_done());
}

#[test]
fn bytes_after_the_end_are_left_untouched() {
    let out = whole(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n").unwrap();
    assert_eq!(out.data, b"abc");
    assert_eq!(&out.rest[..], b"HTTP/1.1 200 OK\r\n");

    let out = whole(b"0\r\nA: 1\r\n\r\n\r\nextra").unwrap();
    assert!(out.trailers.is_some());
    assert_eq!(&out.rest[..], b"\r\nextra");
    // Arriving only after the end, too.
    let out = feed(&[b"0\r\n\r\n", b"more"]).unwrap();
    assert_eq!(&out.rest[..], b"more");
}

/// The chunked encoding of the non-empty chunks, each size in upper or lower case hex and
/// sometimes with an extension.
fn encode(chunks: &[(Vec<u8>, bool, bool)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (data, upper, ext) in chunks.iter().filter(|(d, ..)| !d.is_empty()) {
        let size = if *upper {
            format!("{:X}", data.len())
        } else {
            format!("{:x}", data.len())
        };
        out.extend_from_slice(size.as_bytes());
        if *ext {
            out.extend_from_slice(b" ;n=\"v\\\"\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// `input` cut at the given points.
fn split_at(input: &[u8], points: &[prop::sample::Index]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = points.iter().map(|p| p.index(input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = 0;
    for cut in cuts.into_iter().chain([input.len()]) {
        pieces.push(input[from..cut].to_vec());
        from = cut;
    }
    pieces
}

proptest! {
    #[test]
    fn any_chunks_decode_to_their_concatenation(
        chunks in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..300), any::<bool>(), any::<bool>()),
            0..8,
        ),
        points in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let input = encode(&chunks);
        let pieces = split_at(&input, &points);
        let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let out = feed(&pieces).unwrap();
        let expected: Vec<u8> = chunks.iter().flat_map(|(d, ..)| d.iter().copied()).collect();
        prop_assert_eq!(out.data, expected);
        prop_assert!(out.done);
        prop_assert!(out.trailers.is_none());
        prop_assert!(out.rest.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        input in prop::collection::vec(any::<u8>(), 0..600),
        points in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let pieces = split_at(&input, &points);
        let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let _ = feed(&pieces);
    }

    // Random bytes rarely get past the size line; these are made of what chunked framing is.
    #[test]
    fn chunked_like_bytes_never_panic(
        input in prop::collection::vec(
            prop::sample::select(b"0123abcfAF;= \t\"\\\r\n\r\n:xX".to_vec()),
            0..600,
        ),
        points in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let pieces = split_at(&input, &points);
        let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let _ = feed(&pieces);
    }
}
