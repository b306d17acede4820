use super::*;

#[test]
fn one_url_is_a_list_of_one() {
    assert_eq!(
        parse(" http://127.0.0.1:3001 ").expect("one"),
        ["http://127.0.0.1:3001"]
    );
}

#[test]
fn several_are_kept_in_order_and_trimmed() {
    assert_eq!(
        parse("http://a:1, https://b:2/x ,http://[::1]:3").expect("three"),
        ["http://a:1", "https://b:2/x", "http://[::1]:3"]
    );
}

#[test]
fn an_empty_element_is_named_by_its_place() {
    for (list, n) in [
        ("http://a,,http://b", 2),
        ("http://a,", 2),
        (",http://a", 1),
        ("http://a, ,http://b", 2),
        ("", 1),
    ] {
        let e = parse(list).expect_err(list);
        assert!(
            matches!(e, ListError::Empty { n: got, .. } if got == n),
            "{list}: {e}"
        );
        assert!(
            e.to_string().contains(&format!("URL number {n} is empty")),
            "{e}"
        );
    }
}

#[test]
fn an_element_that_is_not_http_is_named() {
    for (list, bad) in [
        ("http://a:1,ftp://b", "ftp://b"),
        ("hub-b:3001,http://a:1", "hub-b:3001"),
        ("http://a:1,http://", "http://"),
    ] {
        let e = parse(list).expect_err(list);
        assert!(matches!(e, ListError::Url(_)), "{list}: {e}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{list}: {e}");
    }
}
