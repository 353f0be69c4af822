#!/usr/bin/env python3
"""Writes the generated part of the ringlm tokenizer corpus (gen_*.txt) next to this script.

The output is deterministic (a fixed seed, no clock, no locale), so running it again reproduces the committed
files byte for byte. Everything here was written for ringlm: word lists, templates and snippets are our own.
Usage: python3 data/corpus/gen_corpus.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
R = random.Random(20240315)


def pick(xs):
    return R.choice(xs)


def maybe(p, s, alt=""):
    return s if R.random() < p else alt


MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def rdate():
    return R.randint(2015, 2026), R.randint(1, 12), R.randint(1, 28)


def fmt_date(y, m, d, style=None):
    style = style if style is not None else R.randint(0, 5)
    if style == 0:
        return f"{y}-{m:02d}-{d:02d}"
    if style == 1:
        return f"{d} {MONTHS[m - 1]} {y}"
    if style == 2:
        return f"{MONTHS[m - 1]} {d}, {y}"
    if style == 3:
        return f"{m:02d}/{d:02d}/{y}"
    if style == 4:
        return f"{d:02d}.{m:02d}.{y}"
    return f"{MONTHS[m - 1][:3]} {d} {y}"


def rtime():
    return f"{R.randint(0, 23):02d}:{R.choice([0, 5, 10, 15, 20, 30, 40, 45, 50, 55]):02d}"


def money(lo, hi):
    return f"{R.uniform(lo, hi):.2f}"


# ----------------------------------------------------------------------------------------------------------
# English

PEOPLE = ["Maya", "Tomás", "Priya", "Jonas", "Aiko", "Samuel", "Leila", "Oskar", "Grace", "Daniel", "Nadia",
          "Felix", "Ingrid", "Kwame", "Lucía", "Hannah", "Omar", "Zoe", "Viktor", "Mei", "Arjun", "Elena",
          "Rafael", "Chloé", "Björn", "Amara", "Noah", "Sofia", "Ravi", "Margit"]
PLACES = ["the harbour", "the old mill", "the hospital", "the station", "the library", "the bakery",
          "the community hall", "the river path", "the hardware store", "the school gym", "the market square",
          "the ferry terminal", "the botanical garden", "the museum", "the swimming pool", "the post office",
          "the repair shop", "the town hall", "the allotments", "the airport"]
ACTIVITIES = ["fixed the leaking tap in the kitchen", "walked the dog along the canal", "finished the quarterly report",
              "repotted the basil and the rosemary", "baked two loaves of rye bread", "cleaned out the garage",
              "read three chapters of the new novel", "went for a long run before breakfast",
              "helped a neighbour move a sofa up four flights of stairs", "called the insurance company twice",
              "painted the back fence", "replaced the bicycle chain", "sorted old photographs into albums",
              "practised the piano for an hour", "wrote letters to my grandparents", "assembled a bookshelf",
              "made soup from whatever was left in the fridge", "answered a mountain of email",
              "studied for the driving test", "planted garlic in the raised bed", "backed up the laptop",
              "visited the dentist", "tidied the workshop", "learned how to sharpen a chisel properly",
              "tested the new recipe for lentil curry", "watched the match at the pub with friends"]
WEATHER_EN = ["cold and clear", "grey and drizzly", "warm with a light breeze", "windy, with sudden showers",
              "foggy until noon", "bright but freezing", "humid and heavy", "sunny all day",
              "stormy in the evening", "mild and overcast", "snowing on and off", "perfect for a walk"]
FEELINGS = ["tired but satisfied", "a little restless", "surprisingly calm", "cheerful", "behind on everything",
            "grateful for small things", "too busy to think", "quietly proud", "ready for the weekend",
            "slightly annoyed at myself", "full of plans", "content"]
OPENERS = ["In the morning", "After lunch", "Later that afternoon", "Before dinner", "Around midnight",
           "First thing", "Once the rain stopped", "On the way home", "While the kettle boiled", "At the weekend"]


def diary_entry():
    y, m, d = rdate()
    lines = [f"{DAYS[R.randint(0, 6)]}, {fmt_date(y, m, d, R.choice([1, 2]))}"]
    s = [f"The weather was {pick(WEATHER_EN)}."]
    for _ in range(R.randint(2, 4)):
        who = pick(["I", "I", "We", pick(PEOPLE) + " and I", pick(PEOPLE)])
        s.append(f"{pick(OPENERS)}, {who} {pick(ACTIVITIES)}" +
                 maybe(0.4, f" near {pick(PLACES)}") + ".")
    if R.random() < 0.5:
        s.append(f"{pick(PEOPLE)} called at {rtime()} to ask about {pick(['the tickets', 'the rent', 'Sunday', 'the car', 'the recipe', 'the meeting', 'the book I borrowed'])}.")
    s.append(f"Spent {money(3, 90)} on {pick(['groceries', 'train tickets', 'a new lamp', 'paint', 'seeds', 'coffee beans', 'a birthday present', 'screws and glue'])}.")
    s.append(f"Feeling {pick(FEELINGS)}.")
    lines.append(" ".join(s))
    return "\n".join(lines)


PRODUCTS = ["electric kettle", "hiking boots", "wireless headphones", "cast iron pan", "desk lamp",
            "rain jacket", "coffee grinder", "mechanical keyboard", "backpack", "food processor",
            "office chair", "tent", "water bottle", "e-reader", "blender", "vacuum cleaner", "bike light",
            "sleeping bag", "toaster", "monitor stand"]
PROS = ["feels solid and well made", "heats up quickly", "is lighter than it looks", "was easy to set up",
        "arrived two days early", "is quiet even at full power", "has a battery that lasts for days",
        "looks great on the shelf", "is easy to clean", "kept me dry in a real downpour",
        "comes with clear instructions", "folds flat for storage", "has a sensible warranty"]
CONS = ["the cable is too short", "the buttons are a bit stiff", "the manual is confusing",
        "it scratches easily", "the lid does not close properly", "it is louder than I expected",
        "the colour is not quite what the photo shows", "the strap started fraying after a month",
        "it is slightly too heavy to carry far", "replacement parts are hard to find",
        "the app asks for far too many permissions"]


def review():
    stars = R.choice([1, 2, 3, 3, 4, 4, 4, 5, 5, 5])
    p = pick(PRODUCTS)
    title = {1: "Disappointing", 2: "Not great", 3: "Does the job", 4: "Very good overall", 5: "Excellent"}[stars]
    body = [f"I bought this {p} {pick(['in the spring', 'last month', 'as a gift', 'to replace an old one', 'after reading a lot of reviews', 'on sale'])}."]
    body.append(f"It {pick(PROS)} and it {pick(PROS)}.")
    if stars < 5 or R.random() < 0.3:
        body.append(f"On the other hand, {pick(CONS)}.")
    if stars <= 2:
        body.append(f"I contacted support on {fmt_date(*rdate())} and {pick(['never heard back', 'got a refund after two weeks', 'they sent a replacement that had the same problem'])}.")
    body.append(f"{pick(['Would I buy it again?', 'Recommended?', 'Verdict:'])} {pick(['Probably.', 'Yes, at this price.', 'Only on sale.', 'No.', 'Absolutely.', 'Hard to say.'])}")
    return f"{'★' * stars}{'☆' * (5 - stars)} {title} — {p}, {money(9, 249)} EUR\n" + " ".join(body)


INGREDIENTS = [("flour", "g"), ("sugar", "g"), ("butter", "g"), ("milk", "ml"), ("water", "ml"), ("eggs", ""),
               ("onions", ""), ("garlic cloves", ""), ("tomatoes", ""), ("olive oil", "tbsp"), ("salt", "tsp"),
               ("black pepper", "tsp"), ("rice", "g"), ("lentils", "g"), ("potatoes", "g"), ("carrots", ""),
               ("ginger", "cm"), ("soy sauce", "tbsp"), ("honey", "tbsp"), ("lemon juice", "tbsp"),
               ("chickpeas", "g"), ("spinach", "g"), ("cumin", "tsp"), ("paprika", "tsp"), ("yoghurt", "g")]
DISHES = ["lentil soup", "tomato risotto", "spiced chickpea stew", "potato gratin", "lemon cake",
          "vegetable curry", "garlic noodles", "spinach pie", "carrot and ginger soup", "honey flapjacks",
          "fried rice", "onion tart", "yoghurt flatbreads", "roast vegetables", "pancakes"]
STEPS = ["Preheat the oven to {t} degrees.", "Chop the {i} finely.", "Heat the oil in a large pan.",
         "Add the {i} and cook for {n} minutes, stirring often.", "Stir in the {i} and bring to a gentle simmer.",
         "Whisk the {i} until smooth.", "Cover and leave for {n} minutes.",
         "Blend until smooth, adding water if needed.", "Pour into a greased tin and bake for {n} minutes.",
         "Season with salt and pepper.", "Taste and adjust the seasoning.",
         "Leave to cool for {n} minutes before slicing.", "Serve hot, with bread on the side."]


def recipe():
    dish = pick(DISHES)
    ings = R.sample(INGREDIENTS, R.randint(4, 8))
    out = [f"Recipe: {dish} (serves {R.randint(2, 6)}, about {R.choice([20, 25, 30, 40, 45, 60, 90])} minutes)",
           "Ingredients:"]
    for name, unit in ings:
        qty = R.choice([1, 2, 3, 4]) if unit in ("", "tbsp", "tsp", "cm") else R.choice([50, 100, 150, 200, 250, 300, 400, 500])
        out.append(f"- {qty}{' ' + unit if unit else ''} {name}")
    out.append("Method:")
    # steps keep the list's (cooking) order
    for k, j in enumerate(sorted(R.sample(range(len(STEPS)), R.randint(4, 7)))):
        step = STEPS[j].format(t=R.choice([160, 180, 190, 200, 220]), i=pick(ings)[0], n=R.choice([3, 5, 8, 10, 15, 20, 25, 35]))
        out.append(f"{k + 1}. {step}")
    return "\n".join(out)


CITIES = ["Lisbon", "Kraków", "Montréal", "Nairobi", "Osaka", "Valparaíso", "Reykjavík", "Tbilisi", "Hanoi",
          "Edinburgh", "Marrakesh", "Ljubljana", "Hobart", "Tromsø", "Cusco", "Seville", "Busan", "Chengdu",
          "Bergen", "Oaxaca"]
TRANSPORT = ["train", "bus", "ferry", "night train", "shared taxi", "flight", "coach"]


def itinerary():
    a, b = R.sample(CITIES, 2)
    out = [f"Trip notes: {a} to {b}"]
    y, m, d = rdate()
    for k in range(R.randint(3, 5)):
        out.append(f"Day {k + 1} ({fmt_date(y, m, min(28, d + k), 0)}): {pick(TRANSPORT)} at {rtime()}, "
                   f"{R.randint(1, 14)}h{R.randint(0, 59):02d}m, ticket {money(5, 180)} EUR. "
                   f"{pick(['Check in after 15:00.', 'Breakfast included.', 'Book the museum online.', 'Bring cash for the market.', 'Platform changes often, check the board.', 'Hostel has lockers, bring a padlock.', 'Sunset around ' + rtime() + '.'])}")
    return "\n".join(out)


QUESTIONS = [("How do I reset my password?",
              "Open the sign-in page, choose \"Forgot password\", and follow the link we email you. The link expires after {n} minutes."),
             ("Can I change my delivery address after ordering?",
              "Yes, as long as the order has not shipped. Go to Orders, select the order, and edit the address. Changes made after {t} are applied the next working day."),
             ("What happens if I miss a payment?",
              "We send a reminder after {n} days. If the payment is still missing after {m} days, the account is paused until it is settled."),
             ("Do you ship internationally?",
              "We ship to {n} countries. Delivery usually takes {m} to {k} working days, and customs fees are paid by the recipient."),
             ("How long is the warranty?",
              "Every device comes with a {n}-month warranty covering manufacturing defects. Accidental damage is not included."),
             ("Is my data stored securely?",
              "Data is encrypted at rest and in transit. Backups are kept for {n} days and then deleted."),
             ("Why was my upload rejected?",
              "Files larger than {n} MB or in an unsupported format are rejected. Supported formats are PNG, JPEG, PDF and CSV.")]


def faq():
    q, a = pick(QUESTIONS)
    n, m = sorted(R.sample(range(2, 60), 2))
    return f"Q: {q}\nA: " + a.format(n=n, m=m, k=m + R.randint(2, 9), t=rtime())


TEAMS = ["Riverside Rovers", "Northgate United", "Harbour City", "Eastwood Athletic", "Millbrook FC",
         "Castle Park", "Westfield Wanderers", "Old Town Rangers"]


def sports():
    out = [f"Results, {fmt_date(*rdate(), 1)}:"]
    teams = R.sample(TEAMS, 6)
    for i in range(0, 6, 2):
        out.append(f"{teams[i]} {R.randint(0, 4)}–{R.randint(0, 4)} {teams[i + 1]} (attendance {R.randint(800, 24000):,})")
    out.append(f"{pick(PEOPLE)} scored {pick(['twice', 'a late winner', 'from the penalty spot', 'a header in the 89th minute', 'on debut'])}.")
    return "\n".join(out)


CONNECT = ["However,", "Meanwhile,", "As a result,", "In practice,", "For example,", "Even so,", "By contrast,",
           "Over time,", "In the end,", "Surprisingly,"]
TOPICS = [
    ("solar panels", ["convert sunlight into electricity", "work best when facing the midday sun",
                      "lose a little efficiency every year", "need very little maintenance apart from cleaning",
                      "produce less on cloudy winter days"]),
    ("honeybees", ["communicate the direction of flowers with a dance", "keep the hive at a steady temperature",
                   "visit thousands of flowers in a single day", "store honey for the winter",
                   "are sensitive to some pesticides"]),
    ("public transport", ["reduces traffic in city centres", "depends on reliable timetables",
                          "is cheaper per passenger than private cars", "needs steady public funding",
                          "works best when lines connect well"]),
    ("sleep", ["helps the brain consolidate memories", "follows cycles of roughly ninety minutes",
               "is disturbed by bright screens late at night", "becomes lighter as people age",
               "affects mood more than most people realise"]),
    ("volcanoes", ["form where magma reaches the surface", "can stay quiet for centuries",
                   "leave behind very fertile soil", "are monitored with seismometers and gas sensors",
                   "sometimes change the weather for a whole year"]),
    ("compilers", ["translate source code into machine instructions", "check types before the program runs",
                   "optimise loops by moving work out of them", "report errors with line numbers",
                   "can be slow on very large projects"]),
    ("forests", ["store large amounts of carbon", "regulate local rainfall", "shelter thousands of species",
                 "recover slowly after fires", "are managed very differently from country to country"]),
    ("batteries", ["store energy as chemical potential", "wear out after many charge cycles",
                   "lose capacity in extreme cold", "should not be stored completely empty",
                   "are increasingly recycled for their metals"]),
    ("maps", ["always distort the curved surface of the earth", "have been drawn for thousands of years",
              "now update in real time on phones", "use symbols that vary between countries",
              "leave out far more than they show"]),
    ("coffee", ["grows best at high altitude in the tropics", "is roasted to develop its flavour",
                "contains caffeine, a mild stimulant", "tastes different depending on the grind",
                "was traded across the Red Sea for centuries"]),
]


def explainer():
    topic, facts = pick(TOPICS)
    fs = R.sample(facts, 4)
    s = [f"{topic[0].upper() + topic[1:]} {fs[0]}.",
         "They " + (fs[1].replace(" ", " also ", 1) if fs[1].split()[0] in ("are", "is", "can") else "also " + fs[1]) + ".",
         f"{pick(CONNECT)} they {fs[2]}, and {pick(['most experts agree that', 'it is worth remembering that', 'few people know that', 'studies suggest that'])} they {fs[3]}."]
    if R.random() < 0.5:
        s.append(f"A {pick(['recent survey', 'report from ' + str(R.randint(2005, 2025)), 'small study', 'long-term project'])} "
                 f"found that {R.randint(3, 97)}% of {pick(['respondents', 'households', 'sites', 'cases'])} "
                 f"{pick(['agreed', 'showed an improvement', 'reported problems', 'had no data'])}.")
    return " ".join(s)


# ----------------------------------------------------------------------------------------------------------
# Chinese

ZH_NAMES = ["小王", "李老师", "张阿姨", "陈师傅", "刘医生", "赵经理", "周同学", "吴奶奶", "孙先生", "林小姐",
            "黄工程师", "郭大爷", "何主任", "马记者", "高教练"]
ZH_CITIES = ["北京", "上海", "广州", "深圳", "成都", "杭州", "西安", "武汉", "南京", "重庆", "长沙", "昆明",
             "青岛", "厦门", "哈尔滨", "拉萨", "苏州", "大连", "乌鲁木齐", "桂林"]
ZH_PLACES = ["图书馆", "菜市场", "火车站", "公园", "医院", "学校", "超市", "博物馆", "体育馆", "咖啡店",
             "书店", "银行", "邮局", "电影院", "码头"]
ZH_ACTS = ["打扫了房间", "去菜市场买了新鲜的蔬菜", "在公园里跑了五公里", "给家里打了一个电话",
           "读完了一本小说", "修好了楼下的自行车", "和朋友一起吃了火锅", "学习了两个小时的英语",
           "整理了这个月的账单", "参加了公司的培训", "在阳台上种了几盆花", "陪孩子做完了作业",
           "去医院看望了生病的同事", "写了一篇工作总结", "包了一大锅饺子", "把旧衣服捐给了社区",
           "在网上报名了摄影课", "帮邻居搬了家", "练习了一个小时的书法", "去银行办理了业务"]
ZH_WEATHER = ["晴", "多云", "阴", "小雨", "中雨", "雷阵雨", "小雪", "大风", "雾", "晴转多云", "阴转小雨"]
ZH_FEEL = ["心情很好", "有点累", "觉得很充实", "有些烦躁", "感到很满足", "特别开心", "平平淡淡", "收获很大"]
ZH_TIMES = ["早上", "上午", "中午", "下午", "傍晚", "晚上", "吃完饭以后", "下班以后", "周末"]
ZH_NUM = "零一二三四五六七八九十"


def zh_diary():
    y, m, d = rdate()
    s = [f"{y}年{m}月{d}日　星期{'一二三四五六日'[R.randint(0, 6)]}　天气：{pick(ZH_WEATHER)}"]
    body = []
    for _ in range(R.randint(2, 4)):
        body.append(f"{pick(ZH_TIMES)}，{pick(['我', '我', '我们', pick(ZH_NAMES) + '和我'])}{pick(ZH_ACTS)}。")
    if R.random() < 0.5:
        body.append(f"在{pick(ZH_PLACES)}碰到了{pick(ZH_NAMES)}，聊了{R.randint(5, 40)}分钟。")
    body.append(f"今天一共花了{R.randint(12, 480)}元，{pick(ZH_FEEL)}。")
    s.append("".join(body))
    return "\n".join(s)


def zh_weather():
    city = pick(ZH_CITIES)
    lo = R.randint(-15, 25)
    hi = lo + R.randint(3, 12)
    return (f"{city}天气预报：{R.randint(1, 12)}月{R.randint(1, 28)}日，{pick(ZH_WEATHER)}，气温{lo}到{hi}摄氏度，"
            f"{pick(['东', '南', '西', '北', '东南', '西北', '东北', '西南'])}风{R.randint(1, 6)}级，"
            f"空气质量{pick(['优', '良', '轻度污染'])}。{pick(['请注意添衣保暖。', '出门请带好雨具。', '适合户外活动。', '请减少户外运动。', '早晚温差较大，注意预防感冒。'])}")


ZH_NEWS_SUBJ = ["市政府", "教育局", "交通部门", "气象台", "图书馆", "社区服务中心", "卫生健康委员会", "科技馆",
                "环保部门", "文化和旅游局"]
ZH_NEWS_ACT = ["发布了新的通知", "举办了一场公益讲座", "开通了三条新的公交线路", "启动了老旧小区改造工程",
               "公布了上半年的统计数据", "开展了垃圾分类宣传活动", "延长了周末的开放时间",
               "推出了网上预约服务", "组织了志愿者清理河道", "召开了新闻发布会"]


def zh_news():
    y, m, d = rdate()
    n = R.randint(3, 980)
    return (f"【{pick(ZH_CITIES)}讯】{m}月{d}日，{pick(ZH_NEWS_SUBJ)}{pick(ZH_NEWS_ACT)}。据介绍，此次活动共有{n}人参加，"
            f"预计将惠及{R.randint(2, 90)}万居民。{pick(['负责人表示，下一步将继续完善相关措施。', '不少市民表示，希望这样的活动能够经常举办。', '相关工作预计在年底前完成。', '具体安排可以关注官方网站。'])}")


ZH_DISH = ["西红柿炒鸡蛋", "红烧肉", "麻婆豆腐", "酸辣土豆丝", "清蒸鱼", "宫保鸡丁", "蒜蓉西兰花", "紫菜蛋花汤",
           "鱼香肉丝", "青椒炒肉"]
ZH_ING = ["鸡蛋", "西红柿", "五花肉", "豆腐", "土豆", "鲈鱼", "鸡胸肉", "西兰花", "紫菜", "青椒", "大蒜", "生姜",
          "葱", "花生", "酱油", "醋", "白糖", "料酒", "豆瓣酱", "淀粉"]
ZH_STEP = ["把{i}洗干净，切成小块。", "把{i}放进碗里，加少许淀粉拌匀。", "锅里倒油，油热后放入{i}翻炒。",
           "加入适量的盐和{i}，继续翻炒一分钟。", "倒入清水，大火烧开后转小火炖{n}分钟。", "水开后放入{i}，蒸{n}分钟。",
           "尝一下味道，根据口味再加一点盐。", "最后撒上葱花，出锅装盘。"]


def zh_recipe():
    ing = R.sample(ZH_ING, R.randint(4, 7))
    out = [f"家常菜：{pick(ZH_DISH)}（{R.randint(2, 5)}人份）", "材料：" + "、".join(ing)]
    for k, j in enumerate(sorted(R.sample(range(len(ZH_STEP)), R.randint(3, 6)))):
        out.append(f"第{ZH_NUM[k + 1]}步：" + ZH_STEP[j].format(i=pick(ing), n=R.randint(3, 40)))
    return "\n".join(out)


ZH_Q = ["请问去{p}怎么走？", "这个多少钱？", "你们几点关门？", "可以用手机支付吗？", "明天会下雨吗？",
        "这本书可以借多久？", "附近有没有地铁站？", "能帮我拍张照片吗？"]
ZH_A = ["往前走两百米，看到红绿灯右转就到了。", "一共{n}元，现在打八折。", "我们晚上{n}点关门，周末营业到十点。",
        "可以的，微信和支付宝都可以。", "天气预报说明天多云，下午可能有小雨。", "可以借三十天，到期以后还能续借一次。",
        "有的，出门左转走五分钟就是。", "没问题，您站在这里，我数一二三。"]


def zh_dialog():
    out = []
    for _ in range(R.randint(2, 4)):
        i = R.randrange(len(ZH_Q))
        out.append(f"甲：{ZH_Q[i].format(p=pick(ZH_PLACES))}")
        out.append(f"乙：{ZH_A[i].format(n=R.randint(5, 120) if i == 1 else R.randint(6, 9))}")
    out.append(f"甲：{pick(['好的，谢谢！', '太好了，谢谢您。', '明白了，麻烦你了。', '知道了，再见！'])}")
    return "\n".join(out)


ZH_ESSAY_OPEN = ["很多人都有这样的经历：", "说起{t}，大家并不陌生。", "最近，{t}成了一个热门话题。",
                 "我一直觉得，{t}是一件值得认真对待的事情。"]
ZH_TOPICS = ["锻炼身体", "阅读", "学习外语", "做饭", "旅行", "节约用水", "垃圾分类", "早睡早起", "养宠物",
             "使用手机", "志愿服务", "保护环境"]
ZH_ESSAY_BODY = ["一开始可能会觉得困难，但是只要坚持下去，就会慢慢看到变化。",
                 "重要的不是一下子做得很好，而是每天都进步一点点。",
                 "有人说没有时间，其实时间就像海绵里的水，挤一挤总是有的。",
                 "和家人朋友一起做，会比一个人做更容易坚持。",
                 "我们不妨从身边的小事做起，比如每天留出半个小时。",
                 "这样做不仅对自己有好处，也能影响身边的人。",
                 "当然，每个人的情况不同，找到适合自己的方法最重要。",
                 "回头看的时候，你会发现自己已经走了很远。"]


def zh_essay():
    t = pick(ZH_TOPICS)
    return pick(ZH_ESSAY_OPEN).format(t=t) + "".join(R.sample(ZH_ESSAY_BODY, R.randint(3, 5)))


# ----------------------------------------------------------------------------------------------------------
# Structured data

FIRST = ["anna", "ben", "carla", "deniz", "eitan", "fatima", "georg", "hiro", "ines", "jakob", "kira", "liam",
         "mateo", "nora", "olu", "petra", "quinn", "rosa", "sven", "tara"]
LAST = ["meyer", "okafor", "rossi", "nakamura", "silva", "novak", "haddad", "jensen", "kowalski", "fischer",
        "garcia", "dubois", "singh", "wong", "larsen"]
DOMAINS = ["example.com", "example.org", "example.net", "mail.example", "corp.example"]
STATUS = ["active", "pending", "suspended", "closed", "trial"]
EVENTS = ["login", "logout", "view", "search", "purchase", "upload", "download", "share", "error", "signup"]
PATHS = ["/", "/docs", "/docs/install", "/pricing", "/blog/2024/03/release-notes", "/account/settings",
         "/api/v1/items", "/api/v1/items/42", "/search?q=tent", "/cart", "/checkout", "/help/contact"]
LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]
SERVICES = ["api", "worker", "scheduler", "auth", "billing", "gateway", "indexer"]
LOG_MSGS = ["request completed", "cache miss for key user:{n}", "retrying upstream call (attempt {k}/5)",
            "connection reset by peer", "job {n} finished in {ms}ms", "rate limit exceeded for client {n}",
            "loaded {n} records from disk", "certificate expires in {k} days", "queue depth is {n}",
            "user {n} updated profile", "slow query ({ms}ms)", "shutting down gracefully"]


def iso_ts():
    y, m, d = rdate()
    return f"{y}-{m:02d}-{d:02d}T{R.randint(0, 23):02d}:{R.randint(0, 59):02d}:{R.randint(0, 59):02d}Z"


def json_user():
    f, l = pick(FIRST), pick(LAST)
    obj = {"id": R.randint(1000, 999999), "username": f"{f}.{l}{maybe(0.3, str(R.randint(1, 99)))}",
           "email": f"{f}.{l}@{pick(DOMAINS)}", "status": pick(STATUS), "created_at": iso_ts(),
           "score": round(R.uniform(0, 100), 2), "tags": R.sample(["beta", "admin", "newsletter", "vip", "mobile", "eu", "us"], R.randint(0, 3)),
           "settings": {"theme": pick(["light", "dark", "system"]), "language": pick(["en", "de", "fr", "zh-CN", "ja", "ko", "es"]),
                        "notifications": R.random() < 0.5}}
    indent = R.choice([None, 2, 4])
    return json.dumps(obj, indent=indent, ensure_ascii=R.random() < 0.3)


def json_event():
    ev = {"event": pick(EVENTS), "user_id": R.randint(1, 50000), "ts": R.randint(1500000000, 1780000000)}
    if ev["event"] in ("view", "search"):
        ev["path"] = pick(PATHS)
        ev["ms"] = R.randint(3, 2400)
    if ev["event"] == "purchase":
        ev["amount"] = round(R.uniform(1, 500), 2)
        ev["currency"] = pick(["EUR", "USD", "GBP", "JPY", "CNY"])
    if ev["event"] == "error":
        ev["code"] = R.choice([400, 401, 403, 404, 409, 429, 500, 502, 503])
    return json.dumps(ev, separators=(",", ":"))


def log_line():
    k = R.randint(1, 5)
    msg = pick(LOG_MSGS).format(n=R.randint(1, 99999), k=k, ms=R.randint(1, 9000))
    y, m, d = rdate()
    return (f"{y}-{m:02d}-{d:02d} {R.randint(0, 23):02d}:{R.randint(0, 59):02d}:{R.randint(0, 59):02d}."
            f"{R.randint(0, 999):03d} {pick(LEVELS):5s} [{pick(SERVICES)}-{R.randint(1, 8)}] {msg}")


def access_log():
    return (f"192.0.2.{R.randint(1, 254)} - - [{R.randint(1, 28):02d}/{pick(MONTHS)[:3]}/{R.randint(2019, 2026)}:"
            f"{R.randint(0, 23):02d}:{R.randint(0, 59):02d}:{R.randint(0, 59):02d} +0000] "
            f"\"{pick(['GET', 'GET', 'GET', 'POST', 'PUT', 'DELETE'])} {pick(PATHS)} HTTP/1.1\" "
            f"{R.choice([200, 200, 200, 201, 204, 301, 304, 400, 404, 500])} {R.randint(0, 90000)}")


def csv_table():
    kind = R.randint(0, 2)
    if kind == 0:
        out = ["date,station,tmin,tmax,rain_mm"]
        y, m, d = rdate()
        st = R.randint(10000, 99999)
        for i in range(R.randint(4, 8)):
            lo = R.uniform(-10, 20)
            out.append(f"{y}-{m:02d}-{min(28, d + i):02d},{st},{lo:.1f},{lo + R.uniform(2, 12):.1f},{max(0, R.gauss(2, 4)):.1f}")
    elif kind == 1:
        out = ["sku,name,qty,price"]
        for _ in range(R.randint(3, 7)):
            out.append(f"{pick(['TEA', 'CUP', 'PEN', 'BAG', 'LMP', 'CBL'])}-{R.randint(100, 999)},\"{pick(PRODUCTS)}\",{R.randint(0, 250)},{money(1, 300)}")
    else:
        out = ["id,name,email,joined"]
        for _ in range(R.randint(3, 6)):
            f, l = pick(FIRST), pick(LAST)
            out.append(f"{R.randint(1, 9999)},{f.title()} {l.title()},{f}@{pick(DOMAINS)},{fmt_date(*rdate(), 0)}")
    return "\n".join(out)


SHELL = ["ls -lh {d}", "cd {d} && git status", "git log --oneline -n {n}", "git checkout -b fix/{w}-{n}",
         "git commit -am \"{W}: handle empty input\"", "grep -rn \"{w}\" src/ | head -{n}",
         "find {d} -name '*.{e}' -mtime -{n}", "tar -xzf {w}-{v}.tar.gz -C /opt", "chmod +x scripts/{w}.sh",
         "python3 -m pytest tests/test_{w}.py -q", "make -j{n} && ./build/{w} --help",
         "curl -fsSL https://example.org/{w}/install.sh | sh", "docker build -t {w}:{v} .",
         "kubectl get pods -n {w} -o wide", "rsync -avz --delete {d}/ backup:/srv/{w}/",
         "ssh {u}@10.0.{n}.{k} 'df -h'", "echo $((\"{n}\" * {k}))", "wc -l {d}/*.{e}",
         "sort -t, -k{k} -n data.csv | tail -{n}", "export {U}_HOME=/opt/{w}", "sudo apt-get install -y {w}",
         "journalctl -u {w} --since \"{n} min ago\"", "cp -r {d} {d}.bak-$(date +%F)", "cat /proc/cpuinfo | grep -c processor"]
WORDS = ["parser", "cache", "server", "report", "backup", "indexer", "metrics", "upload", "invoice", "sensor",
         "scheduler", "auth", "notes", "queue", "render"]
DIRS = ["src", "docs", "build", "logs", "data/raw", "~/projects/site", "/var/log", "/etc/nginx", "tests", "assets/img"]


def shell_session():
    out = []
    for _ in range(R.randint(3, 6)):
        w = pick(WORDS)
        cmd = pick(SHELL).format(d=pick(DIRS), n=R.randint(1, 20), k=R.randint(1, 9), w=w, W=w.title(), U=w.upper(),
                                 e=pick(["c", "h", "py", "json", "log", "md", "txt"]),
                                 v=f"{R.randint(0, 3)}.{R.randint(0, 20)}.{R.randint(0, 9)}", u=pick(FIRST))
        out.append(f"{pick(['$', '$', '#', '~$'])} {cmd}")
    return "\n".join(out)


def config_block():
    w = pick(WORDS)
    kind = R.randint(0, 2)
    if kind == 0:
        return (f"[{w}]\nenabled = {pick(['true', 'false'])}\nport = {R.randint(1024, 65535)}\n"
                f"timeout_ms = {R.choice([250, 500, 1000, 5000, 30000])}\npath = \"/var/lib/{w}\"\n"
                f"retries = {R.randint(0, 10)}")
    if kind == 1:
        return (f"{w}:\n  replicas: {R.randint(1, 12)}\n  image: registry.example/{w}:{R.randint(1, 4)}.{R.randint(0, 30)}\n"
                f"  resources:\n    cpu: \"{R.choice([250, 500, 1000, 2000])}m\"\n    memory: {R.choice([128, 256, 512, 1024, 4096])}Mi")
    return "\n".join(f"{w.upper()}_{k}={v}" for k, v in
                     [("HOST", f"10.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}"),
                      ("PORT", str(R.randint(1024, 65535))), ("DEBUG", pick(["0", "1"])),
                      ("WORKERS", str(R.randint(1, 64)))])


def sql_insert():
    f, l = pick(FIRST), pick(LAST)
    return (f"INSERT INTO {pick(['users', 'accounts', 'customers'])} (id, name, email, created_at) VALUES "
            f"({R.randint(1, 99999)}, '{f.title()} {l.title()}', '{f}.{l}@{pick(DOMAINS)}', '{fmt_date(*rdate(), 0)} {rtime()}:00');")


# ----------------------------------------------------------------------------------------------------------
# Code

NOUNS = ["buffer", "packet", "record", "sensor", "account", "order", "frame", "token", "segment", "matrix",
         "invoice", "station", "reading", "request", "session", "voxel", "sample", "route", "ticket", "chunk"]
FIELDS = [("id", "uint32_t", "int"), ("count", "int", "int"), ("size", "size_t", "int"), ("name", "char *", "str"),
          ("value", "double", "float"), ("flags", "uint8_t", "int"), ("offset", "int64_t", "int"),
          ("scale", "float", "float"), ("enabled", "bool", "bool"), ("timestamp", "int64_t", "int")]
C_CHECKS = ["if (!{o}) return -1;", "if ({o}->count < 0) return -2;", "if ({o}->size > MAX_{U}_SIZE) return -3;",
            "if ({o}->name == NULL || {o}->name[0] == '\\0') return -4;", "if ({o}->scale <= 0.0f) return -5;"]


def c_snippet():
    n = pick(NOUNS)
    fs = R.sample(FIELDS, R.randint(3, 6))
    out = [f"typedef struct {n} {{"]
    for name, ct, _ in fs:
        out.append(f"    {ct}{'' if ct.endswith('*') else ' '}{name};")
    out.append(f"}} {n}_t;")
    out.append("")
    kind = R.randint(0, 3)
    if kind == 0:
        out.append(f"int {n}_validate(const {n}_t *{n[0]}) {{")
        for c in R.sample(C_CHECKS, 3):
            out.append("    " + c.format(o=n[0], U=n.upper()))
        out.append("    return 0;")
        out.append("}")
    elif kind == 1:
        out.append(f"void {n}_print(const {n}_t *{n[0]}, FILE *out) {{")
        for name, ct, _ in fs:
            fmt = {"char *": "%s", "double": "%.3f", "float": "%g", "size_t": "%zu", "int64_t": "%lld",
                   "uint32_t": "%u", "uint8_t": "0x%02x", "int": "%d", "bool": "%d"}[ct]
            cast = "(long long)" if ct == "int64_t" else ""
            out.append(f"    fprintf(out, \"{name}={fmt}\\n\", {cast}{n[0]}->{name});")
        out.append("}")
    elif kind == 2:
        out.append(f"static int {n}_cmp(const void *a, const void *b) {{")
        key = pick([f for f in fs if f[1] != "char *"] or fs)[0]
        out.append(f"    const {n}_t *x = a, *y = b;")
        out.append(f"    return (x->{key} > y->{key}) - (x->{key} < y->{key});")
        out.append("}")
        out.append("")
        out.append(f"void {n}_sort({n}_t *items, size_t n) {{ qsort(items, n, sizeof *items, {n}_cmp); }}")
    else:
        out.append(f"{n}_t *{n}_new(void) {{")
        out.append(f"    {n}_t *{n[0]} = calloc(1, sizeof *{n[0]});")
        out.append(f"    if (!{n[0]}) {{")
        out.append(f"        perror(\"{n}_new\");")
        out.append("        return NULL;")
        out.append("    }")
        out.append(f"    return {n[0]};")
        out.append("}")
    return "\n".join(out)


def py_snippet():
    n = pick(NOUNS)
    fs = R.sample(FIELDS, R.randint(2, 5))
    cls = n.title()
    out = []
    kind = R.randint(0, 2)
    if kind == 0:
        out.append("@dataclass")
        out.append(f"class {cls}:")
        for name, _, pt in fs:
            out.append(f"    {name}: {pt}")
        out.append("")
        out.append("    def to_dict(self) -> dict:")
        out.append("        return {" + ", ".join(f"\"{f[0]}\": self.{f[0]}" for f in fs) + "}")
    elif kind == 1:
        out.append(f"def load_{n}s(path):")
        out.append(f"    \"\"\"Reads one {n} per line from a CSV file and skips malformed rows.\"\"\"")
        out.append(f"    {n}s = []")
        out.append("    with open(path, newline=\"\", encoding=\"utf-8\") as f:")
        out.append("        for lineno, row in enumerate(csv.reader(f), start=1):")
        out.append(f"            if len(row) != {len(fs)}:")
        out.append(f"                log.warning(\"%s:%d: expected {len(fs)} fields, got %d\", path, lineno, len(row))")
        out.append("                continue")
        out.append(f"            {n}s.append(row)")
        out.append(f"    return {n}s")
    else:
        k = R.randint(2, 9)
        out.append(f"def summarize_{n}s(items, top={k}):")
        key = fs[0][0]
        out.append(f"    counts = Counter(item.{key} for item in items)")
        out.append(f"    for value, count in counts.most_common(top):")
        out.append(f"        print(f\"{{value!s:>20}} {{count:6d}}\")")
        out.append(f"    return sum(counts.values())")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------

def write(name, makers, target_bytes):
    parts, size = [], 0
    while size < target_bytes:
        text = pick(makers)()
        parts.append(text)
        size += len(text.encode("utf-8")) + 2
    (HERE / name).write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def main():
    write("gen_en_notes.txt", [diary_entry, review, recipe, itinerary, faq, sports, explainer, explainer], 52000)
    write("gen_zh_notes.txt", [zh_diary, zh_weather, zh_news, zh_recipe, zh_dialog, zh_essay, zh_essay], 56000)
    write("gen_data.txt", [json_user, json_event, json_event, log_line, access_log, csv_table, shell_session,
                           config_block, sql_insert], 42000)
    write("gen_code.txt", [c_snippet, c_snippet, py_snippet], 22000)


if __name__ == "__main__":
    main()
