"""The playground page in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver (nothing downloaded at test time; `make browser` installs both), against a real `quickdraft serve`
on the tiny corpus-trained Llama, whose answers copy their context so that n-gram drafts are accepted."""

import shutil

import httpx
import openai
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine, TextDelta
from quickdraft.models.loading import load_model_dir
from tests.server_process import start_server

API_KEY = "playground-key"
PROMPT = "Once upon a time there was a small model that wanted to be fast."
MAX_TOKENS = 40
WAIT_SECONDS = 60
LANES = ("spec", "plain")  # the race's two columns: with speculation, the target alone


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    log = tmp_path_factory.mktemp("playground") / "server.log"
    process = start_server(
        tiny_dirs["llama-corpus"],
        log,
        *("--threads", "1", "--drafter", "ngram", "--k", "auto", "--max-batch", "4"),
        *("--served-model-name", "tiny", "--max-tokens", str(MAX_TOKENS)),
        api_key=API_KEY,
    )
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "Chromium and chromedriver are missing: run `make browser` (Debian packages)"
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser, server):
    """The page, opened afresh, with the API key typed."""
    browser.set_window_size(1280, 900)
    browser.get(server.base_url + "/")
    key = browser.find_element(By.ID, "api-key")
    key.send_keys(API_KEY, Keys.TAB)
    wait_for(browser, lambda: "drafter ngram" in browser.find_element(By.ID, "model-line").text)
    return browser


def wait_for(browser, condition, seconds: float = WAIT_SECONDS):
    return WebDriverWait(browser, seconds).until(lambda _: condition())


def error_text(browser) -> str:
    box = browser.find_element(By.ID, "error")
    return box.text if box.is_displayed() else ""


def greedy_answer(tiny_dirs) -> tuple[str, list[str]]:
    """The engine's greedy answer to PROMPT as a chat at k = 4, with the source of every span of text."""
    target = load_model_dir(tiny_dirs["llama-corpus"], name="tiny")
    engine = Engine(target, SpecConfig(drafter="ngram", k=4))
    events = list(
        engine.stream([{"role": "user", "content": PROMPT}], SamplingParams(max_new_tokens=MAX_TOKENS), chat=True)
    )
    sources = [span.source for event in events if isinstance(event, TextDelta) for span in event.spans if span.text]
    return events[-1].text, sources


def test_the_page_is_served_without_the_key_and_the_api_refuses_until_it_is_typed(browser, server):
    response = httpx.get(server.base_url + "/")
    assert response.status_code == 200 and "quickdraft playground" in response.text
    assert "'self'" in response.headers["content-security-policy"] and API_KEY not in response.text
    browser.get(server.base_url + "/")
    wait_for(browser, lambda: "API key" in error_text(browser))
    unauthorized = httpx.get(server.base_url + "/v1/speculation").json()["error"]["message"]
    assert error_text(browser) == unauthorized  # shown as the server wrote it
    browser.find_element(By.ID, "api-key").send_keys(API_KEY, Keys.TAB)
    wait_for(browser, lambda: error_text(browser) == "")
    assert "tiny: drafter ngram, k auto, up to 4 requests at once" in browser.find_element(By.ID, "model-line").text


def test_an_answer_streams_with_its_accepted_drafts_marked(page, tiny_dirs):
    expected_text, expected_sources = greedy_answer(tiny_dirs)
    assert "ngram" in expected_sources, "the corpus model copies its prompt: some n-gram drafts are accepted"
    Select(page.find_element(By.ID, "k")).select_by_value("4")  # a fixed k: the drafts do not depend on timing
    prompt = page.find_element(By.ID, "prompt")
    prompt.send_keys(PROMPT, Keys.CONTROL, Keys.ENTER)  # the keyboard alone sends
    wait_for(page, lambda: page.find_element(By.ID, "prompt").get_attribute("value") == "")
    answer = page.find_element(By.CSS_SELECTOR, ".message.assistant")
    pieces = answer.find_elements(By.CSS_SELECTOR, ".piece")
    assert answer.get_attribute("textContent") == expected_text and len(pieces) > 1
    assert [piece.get_attribute("data-source") for piece in pieces] == expected_sources
    drafted = answer.find_elements(By.CSS_SELECTOR, ".piece.drafted")
    assert drafted and all(piece.get_attribute("data-source") == "ngram" for piece in drafted)
    assert "accepted draft: ngram" in page.find_element(By.ID, "legend").text
    assert float(page.find_element(By.ID, "tau").text) > 1.0
    assert page.find_element(By.ID, "ttft").text.endswith(" s")
    assert page.find_elements(By.CSS_SELECTOR, "#acceptance li")


def steps_with_several_sequences(server) -> float:
    metrics = server.metrics()
    return metrics["quickdraft_batch_size_count"] - metrics['quickdraft_batch_size_bucket{le="1"}']


def test_a_race_streams_both_at_once_and_shows_identical_texts(page, server):
    batched_before = steps_with_several_sequences(server)
    page.find_element(By.ID, "prompt").send_keys(PROMPT)
    page.find_element(By.ID, "race").click()
    wait_for(page, lambda: page.find_element(By.ID, "race-verdict").text)
    verdict = page.find_element(By.ID, "race-verdict").text
    assert verdict.startswith("Identical texts (greedy)"), verdict
    spec, plain = (page.find_element(By.ID, f"race-{lane}-text").get_attribute("textContent") for lane in LANES)
    assert spec == plain and spec
    assert page.find_elements(By.CSS_SELECTOR, "#race-spec-text .piece.drafted")
    assert not page.find_elements(By.CSS_SELECTOR, "#race-plain-text .piece.drafted")
    for lane in LANES:
        assert page.find_element(By.ID, f"race-{lane}-time").text.startswith("finished in ")
    assert steps_with_several_sequences(server) > batched_before, "both lanes ran in the same engine steps"


def test_a_refused_request_shows_the_servers_message(page, server):
    too_many = 100_000
    page.find_element(By.ID, "max-tokens").clear()
    page.find_element(By.ID, "max-tokens").send_keys(str(too_many))
    page.find_element(By.ID, "prompt").send_keys(PROMPT)
    page.find_element(By.ID, "send").click()
    wait_for(page, lambda: error_text(page))
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=too_many, stream=True
        )
    assert error_text(page) == refused.value.body["message"]
    assert "maximum context length" in error_text(page)
    assert not page.find_elements(By.CSS_SELECTOR, ".message")  # nothing half-shown


def test_on_a_phone_sized_window_nothing_overflows_and_every_control_is_reachable(page):
    page.set_window_size(390, 844)
    overflow = page.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    for control in ("api-key", "drafter", "k", "temperature", "top-p", "max-tokens", "prompt", "send", "race"):
        element = page.find_element(By.ID, control)
        page.execute_script("arguments[0].scrollIntoView()", element)
        assert element.is_displayed() and element.size["width"] > 0, control


def test_a_stream_asked_for_spans_carries_the_engines_sources(server, tiny_dirs):
    """Each text chunk's spans cover its text with the engine's own sources; unasked, chunks carry none."""
    target = load_model_dir(tiny_dirs["llama-corpus"], name="tiny")
    params = SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True)
    events = Engine(target, SpecConfig(drafter="ngram", k=4)).stream(PROMPT, params)
    expected = [event for event in events if isinstance(event, TextDelta) and event.text]
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    for asked in (True, False):
        chunks = client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "quickdraft": {"spans": asked, "k": 4}},
        )
        texts = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].text]
        if not asked:
            assert all("spans" not in chunk.model_extra for chunk in texts)
            continue
        assert [chunk.choices[0].text for chunk in texts] == [delta.text for delta in expected]
        assert [chunk.model_extra["spans"] for chunk in texts] == [
            [{"text": s.text, "source": s.source, "tokens": s.tokens} for s in delta.spans] for delta in expected
        ]
    assert {span.source for delta in expected for span in delta.spans} == {"target", "ngram"}
